"""`tunebot serve`, `tunebot console` and `tunebot demo`: the chat surfaces on the command line.

Heavy imports (SQLAlchemy, slack-bolt, uvicorn, torch for the demo) happen inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

SLACK_HELP = """\
Slack is not configured, so there is nothing to serve yet. To connect Slack (docs/slack-setup.md):
  1. https://api.slack.com/apps -> Create New App -> From an app manifest -> paste manifest.yml.
  2. Install it to your workspace; copy the Bot User OAuth Token (xoxb-...).
  3. Socket Mode (no public URL): Basic Information -> App-Level Tokens -> generate one with
     connections:write (xapp-...), then
       export SLACK_BOT_TOKEN=xoxb-... SLACK_APP_TOKEN=xapp-...;  tunebot serve
  4. Or HTTP mode: copy the Signing Secret, set the request URLs of manifest.yml to
     https://YOUR-HOST/slack/events, then
       export SLACK_BOT_TOKEN=xoxb-... SLACK_SIGNING_SECRET=...;  tunebot serve --http --port 3000
Meanwhile the same commands work in this terminal: tunebot console"""


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


def _runtime(user: str | None = None, *, serving: bool = False):  # type: ignore[no-untyped-def]
    from bot.chat.handlers import ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.engine.service import Engine
    from bot.settings import get_settings

    settings = get_settings()
    extra = (user,) if user else ()
    policy = Permissions.from_settings(settings, extra_admins=extra)  # one policy: engine and chat
    # The local provider trains on this machine: on in the console, off in `serve` unless enabled.
    engine = Engine(
        settings, local_provider=bool(settings.local_provider) if serving else None, permissions=policy
    )
    from bot.providers.registry import secrets

    chat = ChatHandlers(engine, policy, secrets=secrets(settings))
    return settings, engine, chat


def _run_console(user: str) -> int:
    from bot.chat.console import PROMPT, ConsoleNotifier, ConsoleSession, Ticker
    from bot.chat.terminal import cli_console

    console = cli_console()  # piped: tables neither wrap at 80 columns nor cut job ids
    settings, engine, chat = _runtime(user)
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
    from bot.engine.jobstate import ACTIVE
    from bot.engine.watch import UNWATCHED

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
    ) -> None:
        """Run the Slack bot (Socket Mode with SLACK_APP_TOKEN, or --http) and the runner event endpoint."""
        from bot.settings import get_settings

        settings = get_settings()
        socket_mode = not http and settings.slack_app_token is not None
        if http and settings.slack_bot_token is not None and not _secret_set(settings.slack_signing_secret):
            if settings.slack_signing_secret is not None:  # set, but empty: no request could be verified
                typer.echo(EMPTY_SECRET, err=True)
                raise typer.Exit(2)
        ready = settings.slack_bot_token is not None and (
            socket_mode or (http and _secret_set(settings.slack_signing_secret))
        )
        if not ready:
            typer.echo(SLACK_HELP, err=True)
            if sys.stdin.isatty() and typer.confirm("Start the console now?", default=True):
                from bot.engine.permissions import OPERATOR

                raise typer.Exit(_run_console(OPERATOR))
            raise typer.Exit(2)
        raise typer.Exit(_serve(host or listen_host(settings), port, socket_mode=socket_mode))

    @app.command("demo")
    def demo_cmd(
        workdir: Path | None = typer.Option(
            None, "--dir", help="Folder for the demo's files (default: a temp dir)."
        ),
    ) -> None:
        """Play the whole product on this CPU in about a minute: estimate, launch, preempt, finish, spend."""
        from bot.demo import run_demo

        raise typer.Exit(run_demo(workdir=workdir))


def _serve(host: str, port: int, *, socket_mode: bool) -> int:
    import asyncio
    import logging

    import uvicorn

    from bot.chat.notifier import SlackNotifier
    from bot.chat.slack.app import build_app, make_async_client, make_sync_client
    from bot.web import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from bot.chat.people import People

    settings, engine, chat = _runtime(serving=True)
    for warning in chat.permissions.startup_warnings():  # who may approve, where members may launch
        logging.getLogger("tunebot").warning(warning)
    from bot.storage.credentials import startup_warning

    if unscoped := startup_warning(settings):  # runners get the bot's own storage keys
        logging.getLogger("tunebot").warning(unscoped)
    admins = sorted(chat.permissions.admins)
    chat.names = People.slack(make_sync_client(settings))  # users.info, cached: names where mentions fail
    from bot.chat.slack.home import HomePublisher

    home = HomePublisher(chat, make_sync_client(settings), admins=admins).start()
    notifier = SlackNotifier(
        engine,
        make_sync_client(settings),
        summary_channel=settings.summary_channel,
        admins=admins,
        approval_above=settings.approval_above_usd,
        names=chat.names,
        home=home,
    )
    notifier.attach(engine.bus).start()
    secret = settings.slack_signing_secret.get_secret_value() if settings.slack_signing_secret else None
    from bot.chat.slack.files import SlackFiles

    chat.files = SlackFiles.from_settings(settings, make_sync_client(settings))  # dataset=slack:F...
    bolt = build_app(
        chat, client=make_async_client(settings), signing_secret=secret, socket_mode=socket_mode, home=home
    )
    web = create_app(
        bolt_app=None if socket_mode else bolt,
        record_runner_event=engine.record_runner_event,
        runner_token_job=engine.runner_token_job,
        signing_secret=secret,
        max_body_bytes=settings.http_max_body_kb << 10,
    )
    if host in ("127.0.0.1", "localhost", "::1") and not socket_mode:
        logging.getLogger(__name__).warning(
            "listening on %s:%d only: Slack and remote runners reach it through a reverse proxy on this "
            "machine, or set TUNEBOT_PUBLIC_URL (or --host) to listen on every interface",
            host,
            port,
        )
    scheduler = _start_scheduler(engine, settings)
    server = uvicorn.Server(uvicorn.Config(web, host=host, port=port, log_level="info", access_log=False))

    async def main() -> None:
        if socket_mode:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            handler = AsyncSocketModeHandler(bolt, settings.slack_app_token.get_secret_value())  # type: ignore[union-attr]
            await handler.connect_async()
        await server.serve()

    try:
        # No resume here: only the scheduler's leader runs it (reconcile, adoption, stale launches), so a
        # replica started next to a running leader neither steals its launches nor races its adoptions.
        asyncio.run(main())
    finally:
        scheduler()
        notifier.stop()
        home.stop()
        engine.close()
    return 0


def _start_scheduler(engine, settings):  # type: ignore[no-untyped-def]
    """The scheduler's loop when bot.scheduler exists; else a ticker. Returns a stop function."""
    try:
        from bot import scheduler as sched  # type: ignore[attr-defined]

        start = getattr(sched, "start_scheduler", None)
        if callable(start):
            handle = start(engine, settings, on_lead=engine.resume_all)
            return getattr(handle, "shutdown", lambda: None)
    except ImportError:
        pass
    from bot.chat.console import Ticker

    engine.resume_all()
    ticker = Ticker(engine.tick, every_s=min(settings.reconcile_every_s, 10.0)).__enter__()
    return lambda: ticker.__exit__(None, None, None)
