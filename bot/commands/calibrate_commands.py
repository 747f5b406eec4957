"""`tunebot calibrate import FILE | show | exclude RUN | include RUN`: the measurements the planner learns
from, what it learned, and undoing what a run moved.

Finished runs are recorded by the engine on their own; `import` seeds the store from a team's past runs (CSV
or JSON, the columns of a finished run: gpu, gpus, the request fields, max_memory_reserved_gb,
device_memory_used_gb, tokens_per_second), and `show` prints the correction per (GPU, stack, method, size
class) and every run behind it with its job, host and owner, and whether it counts (or waits for other hosts
to corroborate it, bot/planner/calibration.py). `exclude RUN` takes a run out (it moves no estimate until
`include RUN`). The CLI acts as the operator, an admin. Bad files exit 2 with the line that is wrong; nothing
is stored from them.
"""

from __future__ import annotations

from pathlib import Path

import typer

from bot.commands.errors import fail

calibrate_app = typer.Typer(
    name="calibrate",
    help="What finished runs measured, and how it moves the estimates.",
    no_args_is_help=True,
)


def _engine():  # type: ignore[no-untyped-def]
    from bot.commands.engine_commands import _engine as engine

    return engine()


@calibrate_app.command("import")
def import_command(
    file: Path = typer.Argument(..., help="CSV (header row) or JSON list of measurements."),
) -> None:
    """Add measurements from past runs (the format bench/gpu_check writes)."""
    from bot.engine.outcome.calibration import CalibrationImportError, add, parse_import

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {file}: {exc}")
    try:
        measurements = parse_import(text, file.name)
    except CalibrationImportError as exc:
        fail(str(exc))
    eng = _engine()
    try:
        added = add(eng, measurements)
    finally:
        eng.close()
    gpus = sorted({m.gpu for m in measurements})
    typer.echo(
        f"imported {added} measurement(s) from {file} ({', '.join(gpus)}); see `tunebot calibrate show`"
    )


@calibrate_app.command("show")
def show_command(
    as_json: bool = typer.Option(False, "--json", help="Corrections and the runs behind them as JSON."),
) -> None:
    """The correction per (GPU, stack, method, size class) and the runs behind it (job, host, owner)."""
    from bot.engine.outcome.calibration import report
    from bot.engine.permissions import OPERATOR

    eng = _engine()
    try:
        view = report(eng, user=OPERATOR)
    finally:
        eng.close()
    if as_json:
        typer.echo(view.model_dump_json(indent=2))
        return
    if not view.runs:
        typer.echo(
            "no measurements yet: finished runs are recorded automatically; `tunebot calibrate import FILE`"
        )
        typer.echo("seeds them from past runs. Estimates use the physics alone.")
        return
    from bot.chat.cards import calibration_reply
    from bot.commands.engine_commands import _show

    _show(calibration_reply(view, limit=None))


@calibrate_app.command("exclude")
def exclude_command(
    run: str = typer.Argument(..., help="The run (its job id, as `calibrate show` lists it)."),
) -> None:
    """Take a run out of the calibration: it moves no estimate until `calibrate include RUN`."""
    _exclude(run, undo=False)


@calibrate_app.command("include")
def include_command(
    run: str = typer.Argument(..., help="An excluded run (its job id)."),
) -> None:
    """Count an excluded run again."""
    _exclude(run, undo=True)


def _exclude(run: str, *, undo: bool) -> None:
    from bot.engine.api import EngineError
    from bot.engine.outcome.calibration import exclude
    from bot.engine.permissions import OPERATOR

    eng = _engine()
    try:
        typer.echo(exclude(eng, run, user=OPERATOR, undo=undo))
    except EngineError as exc:
        fail(str(exc))
    finally:
        eng.close()


def register(app: typer.Typer) -> None:
    app.add_typer(calibrate_app, name="calibrate")
