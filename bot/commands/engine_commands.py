"""`tunebot launch | jobs | approve | stop | resume | clone | spend | reconcile | volumes`: the job engine on
the command line.

Each command builds an ``Engine`` on the configured database (SQLite in the data folder by default)
and providers (the local one always). Heavy imports happen inside the commands. Bad input gets a
clear message and exit code 2, never a traceback.

Who acts: the operator (bot/engine/permissions.OPERATOR), the person who runs the bot on this machine, an
admin of it. ``--user NAME`` names whom a job is for (launch, clone: its owner and whose budgets count) or
whom to act as on stop, resume and volumes (never more than the operator may); ``approve`` is always the
operator's own: the CLI never approves in a member's name.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import typer

from bot.commands import chat_door
from bot.commands.errors import fail
from bot.engine.record.jobstate import FINAL, JobState

if TYPE_CHECKING:
    from bot.chat.replies import Reply
    from bot.engine.api import JobView

VOLUME_HINT = "delete one with `tunebot volumes --delete ID --provider PROVIDER` (or --keep ID)"


def _engine():  # type: ignore[no-untyped-def]
    from bot.engine.service import Engine
    from bot.settings import SettingsError

    try:
        return Engine()
    except SettingsError as exc:  # settings that cannot work: what to set instead
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a bad DATABASE_URL or unreachable database
        fail(f"cannot open the job database: {type(exc).__name__}: {exc}")


def _user(user: str | None) -> str:
    """Who a command acts as: the operator unless ``--user`` names someone (see the module's docstring)."""
    return chat_door.acting_user(user)


def _show(reply: Reply) -> None:
    """Print a reply with the renderer `tunebot console` uses: the CLI, Slack and the console share cards."""
    chat_door.show(reply)


def _print_job(view: JobView) -> None:
    """The job's status card, as Slack shows it in the job's thread (the Stop button aside)."""
    from bot.chat.cards import job_card

    _show(job_card(view, with_buttons=False))


def _print_progress(view: JobView) -> None:
    """One line per change while `launch --wait` follows a job (its card again once it ends)."""
    from bot.chat.cards import job_line
    from bot.chat.replies import text_reply

    _show(text_reply(job_line(view)))


def _approval_hint(job_id: str) -> None:
    from bot.chat.escaping import esc
    from bot.chat.replies import text_reply

    hint = (
        f"needs approval: an admin approves it in Slack, or you, the operator of this machine: "
        f"tunebot approve {esc(job_id)}"
    )
    _show(text_reply(hint, kind="warning"))


def _launch(
    model: str,
    pairs: list[tuple[str, str]],
    *,
    choice: str = "cheapest",
    user: str | None = None,
    team: str | None = None,
    key: str | None = None,
    wait: bool = False,
) -> None:
    from bot.commands.request_cli import build_request

    req = build_request(model, pairs)
    _create(req, choice=choice, user=user, team=team, key=key, wait=wait)


def _create(
    req: Any,
    *,
    choice: str,
    user: str | None,
    team: str | None,
    key: str | None,
    wait: bool,
    engine: Any = None,
) -> None:
    """Create (and launch) the job for a request, print its card, then follow it with ``wait``."""
    from bot.engine.api import EngineError
    from bot.planner.errors import PlanningError

    if not req.dataset:
        fail("a dataset is needed to launch: --dataset PATH or dataset=PATH (a jsonl file or URI)")
    engine = engine or _engine()
    try:
        view = engine.create_job(
            req, user=_user(user), choice=choice, max_cost=req.max_cost, idempotency_key=key, team=team
        )
    except (EngineError, PlanningError) as exc:
        engine.close()
        fail(str(exc))
    _print_job(view)
    if view.state == JobState.PENDING_APPROVAL:
        _approval_hint(view.job_id)
    _supervise(engine, view, wait=wait)
    _follow(engine, view, wait)


def _supervise(engine: Any, view: JobView, *, wait: bool = False) -> None:
    """One line: who supervises this job (this command with --wait, a live `tunebot serve`, or one started
    now in the background); a warning when nothing does (bot/commands/supervisor.py)."""
    from bot.chat.replies import text_reply
    from bot.commands.supervisor import supervision_line

    line = supervision_line(engine, view, wait=wait)
    if line is not None:
        text, kind = line
        _show(text_reply(text, kind=kind))


def _follow(engine: Any, view: JobView, wait: bool) -> None:
    """With ``wait``: tick the engine and print each change until the job ends; then close the engine."""
    try:
        while wait and view.state not in FINAL | {JobState.PENDING_APPROVAL}:
            time.sleep(2.0)
            engine.tick()
            new = engine.get_job(view.job_id)
            if new.state in FINAL:
                _print_job(new)
            elif (new.step, new.state) != (view.step, view.state):
                _print_progress(new)
            view = new
    except KeyboardInterrupt:
        typer.echo("stopped following; the job keeps running (tunebot jobs to check).")
        _supervise(engine, engine.get_job(view.job_id))
    finally:
        engine.close()


def resume_command(
    job_id: str = typer.Argument(..., help="The stopped or failed job to continue."),
    words: list[str] | None = typer.Argument(
        None, metavar="[max_cost=$X]", help="A new spend cap written as in /tune (the same as --max-cost)."
    ),
    max_cost: str | None = typer.Option(
        None,
        "--max-cost",
        "--budget",
        help="A new spend cap for the whole job, e.g. '$5' (a budget-stopped "
        "job needs a higher one; above the approval amount it needs approval).",
        show_default=False,
    ),
    user: str | None = typer.Option(None, "--user", help="Who asks (default: the operator)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the job here until it ends (ticks every 2 s)."),
) -> None:
    """Continue a stopped or failed job from its newest checkpoint (same job, same cap unless max_cost=)."""
    from bot.chat.grammar import ResumeCmd
    from bot.commands.request_cli import parse_chat
    from bot.engine.api import EngineError

    command = parse_chat(["resume", job_id, *(words or [])])  # the chat's words: resume JOB max_cost=$X
    cap = command.max_cost if isinstance(command, ResumeCmd) else None
    if max_cost is not None:
        from bot.planner.options import parse_money

        try:
            cap = parse_money(max_cost)
        except ValueError as exc:
            fail(f"max_cost (--max-cost): {exc}")
    engine = _engine()
    try:
        view = engine.resume(job_id, user=_user(user), max_cost=cap)
    except EngineError as exc:
        engine.close()
        fail(str(exc))
    from bot.chat.cards import PROGRESS_ON_CLI, resumed_reply

    where = "" if wait else PROGRESS_ON_CLI  # with --wait the lines below are its progress
    _show(resumed_reply(view, approval_above=engine.permissions.approval_above, progress=where))
    _print_job(view)
    if view.state == JobState.PENDING_APPROVAL:
        _approval_hint(view.job_id)
    _supervise(engine, view, wait=wait)
    _follow(engine, view, wait)


def _clone(
    job_id: str,
    pairs: list[tuple[str, str]],
    *,
    choice: str = "cheapest",
    user: str | None = None,
    team: str | None = None,
    key: str | None = None,
    wait: bool = False,
) -> None:
    from bot.commands.request_cli import parse_pairs
    from bot.engine.api import EngineError

    changes = parse_pairs(pairs)
    engine = _engine()
    try:
        req = engine.clone_request(job_id, changes, user=_user(user))
    except EngineError as exc:
        engine.close()
        fail(str(exc))
    _create(req, choice=choice, user=user, team=team, key=key, wait=wait, engine=engine)


def _job_options():  # type: ignore[no-untyped-def]
    import inspect

    def param(name: str, annotation: object, default: object) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)

    return [
        param(
            "choice",
            str,
            typer.Option("cheapest", "--choice", help="cheapest, safest, fastest or an offer key."),
        ),
        param(
            "user",
            str | None,
            typer.Option(None, "--user", help="Whom the job is for: its owner (default: the operator)."),
        ),
        param("team", str | None, typer.Option(None, "--team")),
        param(
            "key",
            str | None,
            typer.Option(None, "--idempotency-key", help="Repeating a launch with a key is a no-op."),
        ),
        param(
            "wait",
            bool,
            typer.Option(False, "--wait", help="Follow the job here until it ends (ticks every 2 s)."),
        ),
    ]


def _clone_command():  # type: ignore[no-untyped-def]
    from bot.commands.request_cli import request_command

    return request_command(
        _clone,
        _job_options(),
        "Relaunch a job with changes: its options, with the ones given here changed (the same options as "
        "`tunebot launch`), estimated and priced again, launched as a new job.",
        first=("job_id", "The job to clone (any state)."),
    )


def _launch_command():  # type: ignore[no-untyped-def]
    from bot.commands.request_cli import request_command

    return request_command(
        _launch,
        _job_options(),
        "Launch a fine-tune on the chosen offer (price locked now; approval above the configured amount). "
        "The same options as `tunebot estimate` and /tune; max_cost is the job's spend cap (default: 2x the "
        "estimate).",
    )


def jobs_command(
    job_id: str | None = typer.Argument(
        None,
        metavar="[JOB|mine|all]",
        help="One job; `mine`: the operator's (or --user's); `all`: every job.",
    ),
    user: str | None = typer.Option(None, "--user", help="Only this user's jobs."),
    active: bool = typer.Option(False, "--active", help="Only jobs not finished."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List jobs (newest first) or show one (a sweep: `tunebot status SWEEP`)."""
    from bot.engine.api import EngineError

    if job_id in ("mine", "all"):  # the chat's `jobs mine|all`
        user, job_id = (_user(user) if job_id == "mine" else user), None
    if job_id and job_id.startswith("sw-"):
        fail(f"{job_id} is a sweep: `tunebot status {job_id}` shows it and its runs")
    engine = _engine()
    try:
        views = [engine.get_job(job_id)] if job_id else engine.list_jobs(user=user, active_only=active)
        running = [v.job_id for v in views if v.state == JobState.RUNNING]
        if running and engine.follow(running):  # a runner reported its end: the job is ended (terminated)
            views = [engine.get_job(v.job_id) if v.job_id in running else v for v in views]
    except EngineError as exc:
        fail(str(exc))
    finally:
        engine.close()
    if as_json:
        typer.echo(json.dumps([v.model_dump(mode="json", exclude={"losses"}) for v in views], indent=1))
        return
    if job_id:
        _print_job(views[0])
        return
    from bot.chat.cards import jobs_reply
    from bot.chat.escaping import esc

    title = ("Active jobs" if active else "Jobs") + (f" of {esc(user)}" if user else "")
    _show(jobs_reply(views, title=title, detailed=True, limit=None))


def approve_command(
    job_id: str = typer.Argument(...),
    user: str | None = typer.Option(None, "--user", hidden=True),
) -> None:
    """Approve a job that waits for it, as the operator of this machine (an admin: any job)."""
    from bot.engine.api import EngineError
    from bot.engine.permissions import OPERATOR

    if user is not None and user.strip() != OPERATOR:
        fail(
            "tunebot approve acts as the operator of this machine, never in someone else's name: drop "
            "--user. A member approves in Slack (TUNEBOT_ADMINS)"
        )
    if job_id.startswith("sw-"):  # a sweep: approved as the chat approves it (every run at once)
        chat_door.answer(["approve", job_id], None)
        return
    engine = _engine()
    try:
        view = engine.approve(job_id, approver=OPERATOR)
        _print_job(view)
        _supervise(engine, view)
    except EngineError as exc:
        fail(str(exc))
    finally:
        engine.close()


def stop_command(
    job_id: str = typer.Argument(..., metavar="JOB|SWEEP"), user: str | None = typer.Option(None, "--user")
) -> None:
    """Stop a job gracefully (it checkpoints first), or every run of a sweep; a job not launched yet is
    cancelled."""
    from bot.engine.api import EngineError

    if job_id.startswith("sw-"):
        chat_door.answer(["stop", job_id], user)
        return
    engine = _engine()
    try:
        _print_job(engine.stop(job_id, user=_user(user)))
    except EngineError as exc:
        fail(str(exc))
    finally:
        engine.close()


def spend_command(
    period: str = typer.Argument("today", help="today, week or month."),
    user: str | None = typer.Option(None, "--user"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Spend by user, provider and job, from the prices locked at launch."""
    if period not in ("today", "week", "month"):
        fail(f"unknown period {period!r}: use today, week or month")
    engine = _engine()
    try:
        report = engine.spend(period, user=user)  # type: ignore[arg-type]
    finally:
        engine.close()
    if as_json:
        typer.echo(report.model_dump_json(indent=1))
        return
    from bot.chat.cards import spend_reply

    _show(spend_reply(report, user=user))


def reconcile_command(
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Also resume every active job."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Compare every provider's labelled instances with the database and fix both sides."""
    engine = _engine()
    launches: list[str] = []  # a launch taken over (or relaunched) that raised: the job is back in recovering

    def note(event: Any) -> None:
        if event.data.get("launch_failed"):
            launches.append(f"job {event.job_id}: {event.data['launch_failed']}; back in recovering")

    engine.bus.subscribe(note)
    try:
        report = engine.reconcile()
        if resume:
            engine.resume_all()
    finally:
        engine.close()
    report.errors.extend(dict.fromkeys(launches))  # each once: a take-over and the next tick's relaunch alike
    data = {k: v for k, v in vars(report).items()}
    if as_json:
        typer.echo(json.dumps(data, indent=1))
        return
    typer.echo(
        f"seen {report.seen} instances; adopted {len(report.adopted)}, terminated {len(report.terminated)} "
        f"strays/duplicates, {len(report.finished_terminated)} of finished jobs, lost {len(report.lost)}"
        + (
            f"; skipped (unreachable): {', '.join(report.skipped_providers)}"
            if report.skipped_providers
            else ""
        )
    )
    for problem in report.errors:  # one job's failure never stops the pass or the take-overs: each is named
        typer.echo(f"  not done: {problem}")


def volumes_command(
    delete: str | None = typer.Option(None, "--delete", help="Delete this volume id (asks to confirm)."),
    keep: str | None = typer.Option(None, "--keep", help="Keep this volume id: no reminders for 30 days."),
    provider: str | None = typer.Option(
        None, "--provider", help="The volume's provider (with --delete/--keep)."
    ),
    yes: bool = typer.Option(False, "--yes", help="Confirm the deletion without asking."),
    user: str | None = typer.Option(None, "--user"),
) -> None:
    """Volumes with size, price, cost so far and idle time; delete only with your confirmation."""
    from bot.engine.api import EngineError

    if (delete or keep) and not provider:
        fail("--provider is needed with --delete or --keep")
    engine = _engine()
    try:
        if delete:
            if not yes and not typer.confirm(f"Delete volume {delete} on {provider}? Its data is lost."):
                typer.echo("not deleted")
                return
            engine.delete_volume(provider, delete, user=_user(user))  # type: ignore[arg-type]
            typer.echo(f"deleted {delete} on {provider}")
            return
        if keep:
            engine.keep_volume(provider, keep, user=_user(user))  # type: ignore[arg-type]
            typer.echo(f"keeping {keep} on {provider}: no reminders for 30 days")
            return
        views = engine.volumes()
    except EngineError as exc:
        fail(str(exc))
    finally:
        engine.close()
    from bot.chat.cards import volumes_reply
    from bot.chat.replies import Context

    reply = volumes_reply(views, limit=None)
    if views:
        reply.add(Context([VOLUME_HINT]))
    _show(reply)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("launch")(_launch_command())
    app.command("jobs")(jobs_command)
    app.command("approve")(approve_command)
    app.command("stop")(stop_command)
    app.command("resume")(resume_command)
    app.command("clone")(_clone_command())
    app.command("spend")(spend_command)
    app.command("reconcile")(reconcile_command)
    app.command("volumes")(volumes_command)
