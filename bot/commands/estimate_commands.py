"""`tunebot estimate` (what a fine-tune needs and costs) and `tunebot gpus` (the price catalog).

Heavy imports (the planner, rich, the providers) happen inside the commands so that importing the
CLI stays light. Bad input prints one clear line and exits with code 2, never a traceback.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from bot.planner.offer import Offer
    from bot.planner.result import Estimate


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _estimate(
    model: str, pairs: list[tuple[str, str]], *, as_json: bool = False, calibrated: bool = True
) -> None:
    from bot.commands.request_cli import build_request
    from bot.planner import PlanningError, estimate

    request = build_request(model, pairs)
    if request.dataset is not None and request.tokens is not None:
        _fail("give either a dataset (--dataset, dataset=) or tokens (--tokens, tokens=), not both")
    if request.dataset is not None and "://" not in request.dataset and not Path(request.dataset).is_file():
        _fail(f"dataset file {request.dataset} does not exist")
    calibration = None
    if calibrated:  # what finished runs measured: the snapshot the engine writes, no database opened
        from bot.engine.calibration import read_snapshot
        from bot.planner.plan import calibrate
        from bot.settings import get_settings

        measurements = read_snapshot(get_settings().data_dir)
        calibration = calibrate(measurements) if measurements else None
    try:
        result = estimate(request, calibration=calibration)
    except PlanningError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    _print_estimate(result)


def _estimate_command() -> Callable[..., None]:
    from bot.commands.request_cli import request_command

    extra = [
        inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--json", help="Print the stable JSON contract.")),
        inspect.Parameter("calibrated", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(True, "--calibrated/--physics-only",
                                               help="Apply what finished runs measured (tunebot calibrate "
                                                    "show), or the physics alone.")),
    ]
    return request_command(_estimate, extra, "Estimate memory, time and total cost of a fine-tune, and rank "
                                             "GPU offers. Options as flags or as key=value (like /tune).")


def _print_estimate(est: Estimate) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 120)
    m = est.model
    console.print(
        f"[bold]{escape(m.name)}[/bold] ({escape(m.architecture)}): {m.parameters:,} parameters"
        + (f", {m.active_parameters:,} active" if m.active_parameters != m.parameters else "")
        + f"; {est.method}: {m.trainable_parameters:,} trainable"
    )
    low_high = est.memory.per_gpu_gb_range
    span = f" ({low_high[0]:.1f}-{low_high[1]:.1f})" if low_high else ""
    mem = Table(title=f"Peak memory per GPU: {est.memory.per_gpu_gb:.1f} GB{span}", title_justify="left")
    mem.add_column("component")
    mem.add_column("GB", justify="right")
    for key, value in est.memory.breakdown_gb.items():
        if value:
            mem.add_row(key, f"{value:.2f}")
    mem.add_row("[bold]total[/bold]", f"[bold]{est.memory.per_gpu_gb:.2f}[/bold]")
    console.print(mem)
    s, t = est.speed, est.time
    tps_span = (
        f" ({s.tokens_per_second_range[0]:,.0f}-{s.tokens_per_second_range[1]:,.0f})"
        if s.tokens_per_second_range
        else ""
    )
    hours_span = f" ({t.hours_range[0]:.2f}-{t.hours_range[1]:.2f})" if t.hours_range else ""
    console.print(
        f"Speed on {s.gpu} x{s.gpus}: {s.tokens_per_second:,.0f} tokens/s{tps_span}, MFU {s.mfu:.0%}, "
        f"{s.step_seconds:.2f} s per optimizer step; {t.steps:,} steps for {t.tokens:,} tokens "
        f"x {t.epochs:g} epochs = {t.hours:.2f} h{hours_span}"
    )
    if s.calibration:
        console.print(f"[green]{s.calibration}[/green]")
    if est.training is not None:
        from bot.planner.training import describe

        plan = " · ".join(f"{k} {v}" for k, v in describe(est.training))
        console.print(f"Training: {escape(plan)}", highlight=False)
    _print_offers(console, est)
    if est.suggestions:
        console.print("[bold]Nothing fits. What would:[/bold]")
        for line in est.suggestions:
            console.print(f"  - {escape(line)}")
    console.print("[dim]Assumptions:[/dim]")
    for line in est.assumptions:  # they may quote the dataset's path: literal text, never rich markup
        console.print(f"[dim]  - {escape(line)}[/dim]")
    if est.prices_as_of:
        console.print(f"[dim]  - prices: {escape(est.prices_source)} as of {est.prices_as_of:%Y-%m-%d}[/dim]")


def _cost_range(o) -> str:  # type: ignore[no-untyped-def]
    low_high = o.total_cost_range
    return f" ({low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else ""


def _print_offers(console: Console, est: Estimate, limit: int = 15) -> None:
    from rich.markup import escape
    from rich.table import Table

    fits = [o for o in est.offers if o.fits]
    if fits:
        table = Table(title="Offers that fit, by expected total cost", title_justify="left")
        for col in ("provider", "gpu", "class", "$/h", "hours", "total $", "ckpt min", "labels"):
            table.add_column(
                col, justify="right" if col in ("$/h", "hours", "total $", "ckpt min") else "left"
            )
        shown = fits[:limit] + [o for o in fits[limit:] if o.labels]
        for o in shown:
            table.add_row(
                o.provider,
                f"{o.gpu} x{o.gpu_count}",
                "interruptible" if o.interruptible else "on-demand",
                f"{o.price_per_hour:.2f}",
                f"{o.hours:.2f}",
                f"{o.total_cost:.2f}" + _cost_range(o),
                f"{o.checkpoint_minutes:.0f}" if o.checkpoint_minutes else "-",
                ", ".join(o.labels),
            )
        console.print(table)
    rejected = [o for o in est.offers if not o.fits and o.rejected_by not in ("gpu_count", "gpu", "class")]
    filtered = sum(1 for o in est.offers if o.rejected_by in ("gpu_count", "gpu", "class"))
    if rejected:
        table = Table(title="Rejected offers", title_justify="left")
        table.add_column("provider")
        table.add_column("gpu")
        table.add_column("class")
        table.add_column("why")
        for o in rejected[:limit]:
            table.add_row(
                o.provider,
                f"{o.gpu} x{o.gpu_count}",
                "interruptible" if o.interruptible else "on-demand",
                escape(o.reason),
            )
        if len(rejected) > limit:
            table.caption = f"... and {len(rejected) - limit} more (see --json)"
        console.print(table)
    if filtered:
        console.print(
            f"[dim]{filtered} offer groups with another GPU count, GPU type or capacity class than asked "
            "are not shown (--gpus, --gpu, --interruptible/--on-demand; see --json)[/dim]"
        )


def gpus_command(
    live: bool = typer.Option(False, "--live", help="Ask the providers' APIs (keys from the environment)."),
    gpu: str | None = typer.Option(None, "--gpu", help="Only this GPU."),
    as_json: bool = typer.Option(False, "--json", help="Print the offers as JSON."),
) -> None:
    """The GPU price catalog: every provider's offers, on-demand and interruptible."""
    from bot.planner.errors import PlanningError
    from bot.planner.gpus import gpu as lookup_gpu

    name = None
    if gpu:
        try:
            name = lookup_gpu(gpu).name
        except PlanningError as exc:
            _fail(str(exc))
    notes: list[str] = []
    if live:
        try:
            from bot.providers.catalog import live_catalog
        except ImportError:
            _fail("live prices are not available in this installation (bot.providers.catalog missing)")
        from bot.providers.registry import configured_clouds
        from bot.settings import get_settings

        settings = get_settings()
        asking = configured_clouds(settings)
        if asking:  # progress: a slow cloud may keep this waiting up to the deadline
            typer.echo(
                f"Asking {', '.join(asking)} for live prices (at most {settings.catalog_deadline_s:g} s)…",
                err=True,
            )
        cat = live_catalog(settings, gpu=name)
        offers, notes, source, as_of = list(cat.offers), list(cat.notes), cat.source, cat.as_of
    else:
        from bot.planner.catalog import snapshot_as_of, snapshot_offers

        offers, source, as_of = snapshot_offers(), "snapshot", snapshot_as_of()
    if name:
        offers = [o for o in offers if o.gpu == name]
    offers.sort(key=lambda o: (o.gpu, o.gpu_count, o.price_per_hour))
    if as_json:
        import json

        typer.echo(json.dumps([o.model_dump(mode="json") for o in offers], indent=2))
        return
    _print_catalog(offers, notes, source, as_of)


def _print_catalog(offers: list[Offer], notes: list[str], source: str, as_of: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from bot.planner.gpus import GPUS

    when = f" as of {as_of:%Y-%m-%d %H:%M}" if hasattr(as_of, "strftime") else ""
    table = Table(title=f"GPU offers ({source}{when})", title_justify="left")
    for col in (
        "provider",
        "gpu",
        "n",
        "memory GB",
        "class",
        "$/h",
        "$/GPU-h",
        "storage $/GB-mo",
        "egress $/GB",
        "reliability",
        "preempt/h",
    ):
        table.add_column(col, justify="left" if col in ("provider", "gpu", "class") else "right")
    for o in offers:
        label = GPUS[o.gpu].label if o.gpu in GPUS else o.gpu
        table.add_row(
            o.provider,
            label,
            str(o.gpu_count),
            f"{o.gpu_memory_gb:.0f}",
            "interruptible" if o.interruptible else "on-demand",
            f"{o.price_per_hour:.2f}",
            f"{o.price_per_hour / o.gpu_count:.2f}",
            f"{o.storage_per_gb_month:.2f}",
            f"{o.egress_per_gb:.2f}",
            f"{o.reliability:.3f}" if o.reliability is not None else "-",
            f"{o.preemptions_per_hour:.2f}" if o.interruptible else "-",
        )
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 130)
    console.print(table)
    for note in notes:
        console.print(f"[dim]note: {note}[/dim]")
    if not offers:
        console.print("no offers")


def register(app: typer.Typer) -> None:
    """Add `estimate` and `gpus` to the app."""
    app.command("estimate")(_estimate_command())
    app.command("gpus")(gpus_command)
