"""`tunebot serve`, `tunebot console` and `tunebot demo`: the chat surfaces on the command line.

Heavy imports (SQLAlchemy, slack-bolt, uvicorn, torch for the demo) happen inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

SLACK_HELP = """\
Slack is only partly configured ({have} set), so tunebot serve does not start. To connect Slack
(docs/slack-setup.md):
  1. https://api.slack.com/apps -> Create New App -> From an app manifest -> paste manifest.yml.
  2. Install it to your workspace; copy the Bot User OAuth Token (xoxb-...).
  3. Socket Mode (no public URL): Basic Information -> App-Level Tokens -> generate one with
     connections:write (xapp-...), then
       export SLACK_BOT_TOKEN=xoxb-... SLACK_APP_TOKEN=xapp-...;  tunebot serve
  4. Or HTTP mode: copy the Signing Secret, set the request URLs of manifest.yml to
     https://YOUR-HOST/slack/events, then
       export SLACK_BOT_TOKEN=xoxb-... SLACK_SIGNING_SECRET=...;  tunebot serve --http --port 3000
Without Slack, unset the SLACK_ variables (or pass --no-slack): tunebot serve then supervises the jobs and
writes what would go to their threads to its log."""

NO_SLACK = (
    "Slack is not configured: tunebot serve runs the supervisor alone (schedules, /runner/events and "
    "/healthz on {where}). What would go to a job's thread is written here. To connect Slack: "
    "docs/slack-setup.md."
)
AUTO_IDLE_S = 300.0  # `serve --auto` (started by a CLI command) leaves this long after the last active job

EMPTY_SECRET = """\
SLACK_SIGNING_SECRET is set but empty: tunebot would accept requests it cannot verify, so it does not start.
Copy the Signing Secret from your app's Basic Information page (https://api.slack.com/apps), then
  export SLACK_SIGNING_SECRET=...;  tunebot serve --http
or use Socket Mode (SLACK_APP_TOKEN) instead of --http (docs/slack-setup.md)."""


def _secret_set(secret) -> bool:  # type: ignore[no-untyped-def]
    return secret is not None and bool(secret.get_secret_value().strip())


def listen_host(settings) -> str:  # type: ignore[no-untyped-def]
    """Where `tunebot serve` listens: this machine only (127.0.0.1), in Socket Mode too, unless
    TUNEBOT_PUBLIC_URL says the bot is reached from outside (runner events, Slack's HTTP requests)."""
    return "0.0.0.0" if (settings.public_url or "").strip() else "127.0.0.1"


def _runtime(user: str | None = None, *, serving: bool = False, slack: bool = True):  # type: ignore[no-untyped-def]
    from bot.chat.handlers import ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.engine.service import Engine
    from bot.settings import get_settings

    settings = get_settings()
    extra = (user,) if user else ()
    policy = Permissions.from_settings(settings, extra_admins=extra)  # one policy: engine and chat
    # The local provider trains on this machine: on in the console and the CLI, and in a `serve` without
    # Slack (it supervises what the CLI launched there); off in a Slack `serve` unless enabled.
    engine = Engine(
        settings,
        local_provider=bool(settings.local_provider) if serving and slack else None,
        permissions=policy,
    )
    from bot.chat.charts import charts_folder
    from bot.providers.registry import secrets

    # `compare`'s charts are kept with the rest of tunebot's files (TUNEBOT_DATA_DIR), not in /tmp
    chat = ChatHandlers(engine, policy, secrets=secrets(settings), chart_dir=charts_folder(settings.data_dir))
    return settings, engine, chat


def _run_console(user: str) -> int:
    from bot.chat.console import PROMPT, ConsoleNotifier, ConsoleSession, Ticker
    from bot.chat.terminal import cli_console

    console = cli_console()  # piped: tables neither wrap at 80 columns nor cut job ids
    settings, engine, chat = _runtime(user)
    from bot.chat.cards import PROGRESS_IN_CONSOLE

    chat.progress_note = PROGRESS_IN_CONSOLE  # the ConsoleNotifier below prints it
    from bot.storage.credentials import startup_warning

    if unscoped := startup_warning(settings):  # runners get the bot's own storage keys
        console.print(f"warning: {unscoped}", style="yellow", markup=False, highlight=False)
    ConsoleNotifier(engine, console, progress_every_s=5.0).attach(engine.bus)
    engine.resume_all()
    interactive = sys.stdin.isatty()
    session = ConsoleSession(chat, console, user=user, echo=not interactive)

    def lines():  # type: ignore[no-untyped-def]
        if not interactive:
            yield from sys.stdin
            return
        console.print("tunebot console: type `help`, `exit` to leave.")
        while True:
            try:
                yield console.input(f"[bold cyan]{PROMPT}[/bold cyan]")
            except (EOFError, KeyboardInterrupt):
                return

    with Ticker(engine.tick, every_s=2.0):  # while it is open, the console supervises its jobs itself
        code = session.run(lines())
    _left_unwatched(engine, console)
    engine.close()
    return code


def _left_unwatched(engine, console) -> None:  # type: ignore[no-untyped-def]
    """Leaving the console with jobs still active and no supervisor alive: say so (they keep billing)."""
    from bot.chat.escaping import esc
    from bot.chat.terminal import markup
    from bot.engine.record.jobstate import ACTIVE
    from bot.engine.watching.watch import UNWATCHED

    active = [j.job_id for j in engine.list_jobs(active_only=True) if j.state in ACTIVE]
    if active and not engine.supervised():
        names = ", ".join(esc(j) for j in active[:10])
        text = markup(f":warning: Still active: {names}. {UNWATCHED}")
        console.print(text, style="yellow", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("console")
    def console_cmd(
        user: str | None = typer.Option(None, "--user", hidden=True),
    ) -> None:
        """Chat with tunebot in the terminal as the operator of this machine (an admin): the /tune commands,
        read from stdin (scriptable)."""
        from bot.engine.permissions import OPERATOR

        if user is not None and user.strip() != OPERATOR:
            typer.echo(
                "tunebot console acts as the operator of this machine, never in someone else's name: drop "
                "--user. Members use /tune in Slack",
                err=True,
            )
            raise typer.Exit(2)
        raise typer.Exit(_run_console(OPERATOR))

    @app.command("serve")
    def serve_cmd(
        http: bool = typer.Option(
            False, "--http", help="HTTP mode (SLACK_SIGNING_SECRET) instead of Socket Mode."
        ),
        port: int = typer.Option(
            3000, min=1, max=65535, help="Port of /slack/events, /runner/events, /healthz."
        ),
        host: str | None = typer.Option(
            None,
            help="Interface to listen on (default 127.0.0.1; all interfaces when TUNEBOT_PUBLIC_URL is set).",
        ),
        no_slack: bool = typer.Option(
            False, "--no-slack", help="Run the supervisor alone, even where Slack is configured."
        ),
        auto: bool = typer.Option(
            False,
            "--auto",
            hidden=True,
            help="Started by a CLI command for its job: no Slack; leaves when another supervisor leads, or "
            "5 minutes after the last active job.",
        ),
        auto_idle: float = typer.Option(AUTO_IDLE_S, "--auto-idle", hidden=True, min=0.0),
    ) -> None:
        """Run the supervisor (schedules, the runner event endpoint, /healthz) and, where configured, the
        Slack bot (Socket Mode with SLACK_APP_TOKEN, or --http). Without Slack it supervises jobs alone."""
        from bot.settings import get_settings

        settings = get_settings()
        given = [
            name
            for name, value in (
                ("SLACK_BOT_TOKEN", settings.slack_bot_token),
                ("SLACK_APP_TOKEN", settings.slack_app_token),
                ("SLACK_SIGNING_SECRET", settings.slack_signing_secret),
            )
            if value is not None
        ]
        where = host or ("127.0.0.1" if auto else listen_host(settings))
        if no_slack or auto or not given:
            idle = auto_idle if auto else None
            raise typer.Exit(_serve(where, port, socket_mode=False, slack=False, leave_when_idle=idle))
        socket_mode = not http and settings.slack_app_token is not None
        if http and settings.slack_bot_token is not None and not _secret_set(settings.slack_signing_secret):
            if settings.slack_signing_secret is not None:  # set, but empty: no request could be verified
                typer.echo(EMPTY_SECRET, err=True)
                raise typer.Exit(2)
        ready = settings.slack_bot_token is not None and (
            socket_mode or (http and _secret_set(settings.slack_signing_secret))
        )
        if not ready:  # some Slack variables, not enough to connect: a mistake to fix, not a mode to guess
            typer.echo(SLACK_HELP.format(have=", ".join(given)), err=True)
            raise typer.Exit(2)
        raise typer.Exit(_serve(where, port, socket_mode=socket_mode))

    @app.command("demo")
    def demo_cmd(
        workdir: Path | None = typer.Option(
            None,
            "--dir",
            help="Folder for the demo's files (default: a new one in TUNEBOT_DATA_DIR when set, else in "
            "the temp dir).",
        ),
    ) -> None:
        """Play the whole product on this CPU in about a minute: estimate, launch, preempt, finish, spend."""
        from bot.demo import run_demo

        raise typer.Exit(run_demo(workdir=workdir))


def _logging() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # APScheduler logs every run of every task at INFO (the tick: every 10 s); its warnings still show.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _serve(
    host: str, port: int, *, socket_mode: bool, slack: bool = True, leave_when_idle: float | None = None
) -> int:
    import logging

    import uvicorn

    from bot.web import create_app

    _logging()
    log = logging.getLogger("tunebot")
    settings, engine, chat = _runtime(serving=True, slack=slack)
    for warning in chat.permissions.startup_warnings() if slack else ():  # who approves, where to launch
        log.warning(warning)
    from bot.storage.credentials import startup_warning

    if unscoped := startup_warning(settings):  # runners get the bot's own storage keys
        log.warning(unscoped)
    stops: list = []  # type: ignore[type-arg]
    if slack:
        bolt, secret = _slack(settings, engine, chat, socket_mode, stops)
    else:
        from bot.chat.console import ElsewhereWatcher, log_notifier

        log.info(NO_SLACK.format(where=f"{host}:{port}"))
        notes = log_notifier(engine).attach(engine.bus)  # milestones, progress, summaries: to this log
        # and what other processes do (a CLI launch, start, resume): their events never reach this bus
        stops.append(ElsewhereWatcher(engine, notes.console).attach(engine.bus).start().stop)
        bolt, secret = None, None
    web = create_app(
        bolt_app=None if socket_mode else bolt,
        record_runner_event=engine.record_runner_event,
        runner_token_job=engine.runner_token_job,
        signing_secret=secret,
        max_body_bytes=settings.http_max_body_kb << 10,
    )
    if host in ("127.0.0.1", "localhost", "::1") and slack and not socket_mode:
        logging.getLogger(__name__).warning(
            "listening on %s:%d only: Slack and remote runners reach it through a reverse proxy on this "
            "machine, or set TUNEBOT_PUBLIC_URL (or --host) to listen on every interface",
            host,
            port,
        )
    scheduler = _start_scheduler(engine, settings)
    server = uvicorn.Server(uvicorn.Config(web, host=host, port=port, log_level="info", access_log=False))
    if leave_when_idle is not None:  # `serve --auto`, started by a CLI command for its job
        _leave_when_not_needed(engine, scheduler, server, idle_s=leave_when_idle)

    async def main() -> None:
        if socket_mode:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            handler = AsyncSocketModeHandler(bolt, settings.slack_app_token.get_secret_value())  # type: ignore[union-attr]
            await handler.connect_async()
        await server.serve()

    import asyncio
    import signal

    def stopping(signum: int, _frame: object) -> None:
        # uvicorn takes SIGTERM/SIGINT while it serves, shuts down, then raises the signal again: here, so
        # that the finally below still stops the scheduler (its lease cleared at once) and the notifiers.
        if not server.started:  # a signal during the start-up: leave now, the same way
            raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping)
    try:
        # No resume here: only the scheduler's leader runs it (reconcile, adoption, stale launches), so a
        # replica started next to a running leader neither steals its launches nor races its adoptions.
        asyncio.run(main())
    finally:
        getattr(scheduler, "shutdown", lambda: None)()
        for stop in stops:
            stop()
        engine.close()
    return 0 if server.started else 1


def _slack(settings, engine, chat, socket_mode: bool, stops: list):  # type: ignore[no-untyped-def, type-arg]
    """The Slack side of `serve`: names, App Home, the notifier (job threads), uploads, the bolt app."""
    from bot.chat.notifier import SlackNotifier
    from bot.chat.people import People
    from bot.chat.slack.app import build_app, make_async_client, make_sync_client
    from bot.chat.slack.home import HomePublisher

    admins = sorted(chat.permissions.admins)
    chat.names = People.slack(make_sync_client(settings))  # users.info, cached: names where mentions fail
    home = HomePublisher(chat, make_sync_client(settings), admins=admins).start()
    from bot.chat.charts import charts_folder

    uploads = charts_folder(settings.data_dir) / "slack"  # the threads' charts before upload: with the rest
    uploads.mkdir(mode=0o700, exist_ok=True)
    notifier = SlackNotifier(
        engine,
        make_sync_client(settings),
        summary_channel=settings.summary_channel,
        admins=admins,
        approval_above=settings.approval_above_usd,
        names=chat.names,
        home=home,
        chart_dir=uploads,
    )
    notifier.attach(engine.bus).start()
    stops.extend([notifier.stop, home.stop])
    secret = settings.slack_signing_secret.get_secret_value() if settings.slack_signing_secret else None
    from bot.chat.slack.files import SlackFiles

    chat.files = SlackFiles.from_settings(settings, make_sync_client(settings))  # dataset=slack:F...
    bolt = build_app(
        chat, client=make_async_client(settings), signing_secret=secret, socket_mode=socket_mode, home=home
    )
    return bolt, secret


def _leave_when_not_needed(engine, scheduler, server, *, idle_s: float = AUTO_IDLE_S) -> None:  # type: ignore[no-untyped-def]
    """`serve --auto`: a supervisor a CLI command started for its job. It leaves when another supervisor leads
    (two CLI commands started one each: the scheduler's lease chose the other) and once no job has been
    active for ``idle_s`` (the next CLI command starts a new one)."""
    import logging
    import threading
    import time

    from bot.engine.record.jobstate import ACTIVE
    from bot.engine.watching.watch import supervisor

    log = logging.getLogger("tunebot")
    holder = getattr(scheduler, "holder", None)
    lease_s = float(getattr(scheduler, "lease_s", 15.0))

    def watch() -> None:
        started = idle_since = time.monotonic()
        while not server.should_exit:
            time.sleep(2.0)
            now = time.monotonic()
            leading = bool(getattr(scheduler, "is_leader", False))
            if not leading and now - started > lease_s:
                other = supervisor(engine.ctx)
                if other is not None and other.holder != holder:
                    log.info("another supervisor leads (%s): this one leaves", other.holder)
                    server.should_exit = True
                    return
            if any(j.state in ACTIVE for j in engine.list_jobs(active_only=True)):
                idle_since = now
            elif now - idle_since > idle_s:
                log.info("no active job for %.0f s: this supervisor leaves", idle_s)
                server.should_exit = True
                return

    threading.Thread(target=watch, name="tunebot-auto-leave", daemon=True).start()


def _start_scheduler(engine, settings):  # type: ignore[no-untyped-def]
    """The scheduler (leader lease, periodic tasks; ``on_lead``: the engine's resume_all)."""
    from bot import scheduler as sched

    return sched.start_scheduler(engine, settings, on_lead=engine.resume_all)
