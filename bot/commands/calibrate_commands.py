"""`tunebot calibrate import FILE | show`: the measurements the planner learns from, and what it learned.

Finished runs are recorded by the engine on their own; `import` seeds the store from a team's past runs (CSV
or JSON, the columns of a finished run: gpu, gpus, the request fields, max_memory_reserved_gb,
device_memory_used_gb, tokens_per_second), and `show` prints the correction per (GPU, stack, method, size
class) with the runs behind it. Bad files exit 2 with the line that is wrong; nothing is stored from them.
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
    from bot.engine.calibration import CalibrationImportError, add, parse_import

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
    as_json: bool = typer.Option(False, "--json", help="Corrections and measurement counts as JSON."),
) -> None:
    """The correction per (GPU, stack, method, size class) and the runs behind it."""
    import json

    from bot.engine.calibration import load
    from bot.planner.inputs import calibrate

    eng = _engine()
    try:
        measurements = load(eng)
    finally:
        eng.close()
    cal = calibrate(measurements)
    rows = sorted(cal.corrections.values(), key=lambda c: c.key)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "measurements": len(measurements),
                    "skipped": cal.skipped,
                    "corrections": [
                        {
                            "gpu": c.key[0],
                            "stack": c.key[1],
                            "method": c.key[2],
                            "size": c.key[3],
                            "speed_factor": round(c.speed_factor, 4),
                            "speed_runs": c.speed_runs,
                            "memory_factor": round(c.memory_factor, 4),
                            "memory_runs": c.memory_runs,
                        }
                        for c in rows
                    ],
                },
                indent=2,
            )
        )
        return
    if not measurements:
        typer.echo(
            "no measurements yet: finished runs are recorded automatically; `tunebot calibrate import FILE`"
        )
        typer.echo("seeds them from past runs. Estimates use the physics alone.")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Calibration from {len(measurements)} measurement(s)", title_justify="left")
    for col in ("gpu", "stack", "method", "size", "runs", "speed x", "memory x"):
        table.add_column(col, justify="right" if col in ("runs", "speed x", "memory x") else "left")
    for c in rows:
        table.add_row(
            c.key[0],
            c.key[1],
            c.key[2],
            c.key[3],
            str(c.runs),
            f"{c.speed_factor:.3f} ({c.speed_runs})" if c.speed_runs else "-",
            f"{c.memory_factor:.3f} ({c.memory_runs})" if c.memory_runs else "-",
        )
    console = Console()
    console.print(table)
    console.print(
        "factor = measured / physics, pooled robustly and shrunk toward 1 by n / (n + 2); "
        "(n) = runs with that measurement"
    )
    if cal.skipped:
        console.print(f"{cal.skipped} measurement(s) skipped: their model or GPU is unknown to the planner")


def register(app: typer.Typer) -> None:
    app.add_typer(calibrate_app, name="calibrate")
