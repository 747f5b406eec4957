"""`tunebot estimate` (what a fine-tune needs and costs) and `tunebot gpus` (the price catalog).

Heavy imports (the planner, rich, the providers) happen inside the commands so that importing the
CLI stays light. Bad input prints one clear line and exits with code 2, never a traceback.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from bot.commands.errors import fail

if TYPE_CHECKING:
    from bot.planner.offer import Offer
    from bot.planner.result import Estimate


def _estimate(
    model: str,
    pairs: list[tuple[str, str]],
    *,
    as_json: bool = False,
    calibrated: bool = True,
    offline: bool = False,
) -> None:
    """Priced like the chat and what `tunebot launch` rents (bot/engine/offers.priced_estimate): live where
    a cloud key is set, each silent cloud from its dated snapshot with a note; ``offline``: the snapshot."""
    from bot.commands.request_cli import build_request
    from bot.planner import PlanningError, estimate
    from bot.providers.registry import configured_clouds
    from bot.settings import get_settings

    request = build_request(model, pairs)
    if request.dataset is not None and request.tokens is not None:
        fail("give either a dataset (--dataset, dataset=) or tokens (--tokens, tokens=), not both")
    if request.dataset is not None and "://" not in request.dataset and not Path(request.dataset).is_file():
        fail(f"dataset file {request.dataset} does not exist")
    settings = get_settings()
    calibration = None
    if calibrated:  # what finished runs measured: the snapshot the engine writes, no database opened
        from bot.engine.calibration import read_snapshot
        from bot.planner.plan import calibrate

        measurements = read_snapshot(settings.data_dir)
        calibration = calibrate(measurements) if measurements else None
    live = [] if offline else configured_clouds()
    try:
        if live:
            from bot.engine.offers import priced_estimate
            from bot.providers.registry import build_providers

            if not as_json:  # progress: a slow cloud may keep this waiting up to the deadline
                typer.echo(
                    f"Asking {', '.join(live)} for live prices (at most {settings.catalog_deadline_s:g} s; "
                    "--offline for the snapshot)…",
                    err=True,
                )
            result = priced_estimate(settings, build_providers(settings), request, calibration=calibration)
        else:  # the card says "prices: snapshot as of <date>"
            result = estimate(request, calibration=calibration)
    except PlanningError as exc:
        fail(str(exc))
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
        inspect.Parameter("offline", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--offline",
                                               help="Price from the dated offline snapshot only, without "
                                                    "asking the clouds whose keys are set.")),
    ]
    return request_command(_estimate, extra, "Estimate memory, time and total cost of a fine-tune, and rank "
                                             "GPU offers. Options as flags or as key=value (like /tune).")


def _print_estimate(est: Estimate) -> None:
    """The estimate card Slack and the console show, in its detailed form: the memory breakdown table,
    step time, calibration, fitting and rejected offers, every assumption (bot/chat/cards.py)."""
    from bot.chat.cards import estimate_reply
    from bot.chat.terminal import cli_console, render

    render(estimate_reply(est, estimate_id=None, detailed=True), cli_console())


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
            fail(str(exc))
    notes: list[str] = []
    if live:
        try:
            from bot.providers.catalog import live_catalog
        except ImportError:
            fail("live prices are not available in this installation (bot.providers.catalog missing)")
        from bot.providers.registry import configured_clouds
        from bot.settings import get_settings

        settings = get_settings()
        asking = configured_clouds()
        if asking:  # progress: a slow cloud may keep this waiting up to the deadline
            typer.echo(
                f"Asking {', '.join(asking)} for live prices (at most {settings.catalog_deadline_s:g} s)…",
                err=True,
            )
        cat = live_catalog(settings, gpu=name)
        offers, notes, source, as_of = list(cat.offers), list(cat.notes), cat.source, cat.as_of
    else:
        from bot.providers.snapshot import snapshot_as_of, snapshot_offers

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
    table = Table(title=f"GPU offers ({source}{when})", title_justify="left",
                  caption="memory GB = 10^9 bytes (a card sold as A100 40GB has 40 GiB = 42.9 GB)",
                  caption_justify="left")
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
            f"{o.gpu_memory_gb:.1f}",
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
