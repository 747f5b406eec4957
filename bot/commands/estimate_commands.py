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
    from bot.planner.result import Estimate


def _estimate(
    model: str,
    pairs: list[tuple[str, str]],
    *,
    as_json: bool = False,
    calibrated: bool = True,
    offline: bool = False,
) -> None:
    """Priced like the chat and what `tunebot launch` rents (bot/engine/launching/offers.priced_estimate, with
    the providers `tunebot launch` builds: the clouds whose key is set and this machine's CPU where the local
    provider is on and the runner can start): live where a cloud key is set, each silent cloud from its dated
    snapshot with a note; ``offline``: the snapshot for every cloud (this machine's CPU still offered where
    launch would)."""
    from bot.commands.request_cli import build_request
    from bot.engine.api import EngineError
    from bot.engine.launching.approval import checked_cap
    from bot.engine.launching.offers import snapshot_estimate
    from bot.planner import PlanningError
    from bot.providers.registry import build_providers, configured_clouds
    from bot.settings import get_settings

    request = build_request(model, pairs)
    if request.dataset is not None and request.tokens is not None:
        fail("give either a dataset (--dataset, dataset=) or tokens (--tokens, tokens=), not both")
    if request.dataset is not None and "://" not in request.dataset and not Path(request.dataset).is_file():
        fail(f"dataset file {request.dataset} does not exist")
    settings = get_settings()
    try:  # a cap the bot would refuse at launch is refused here (the snapshot estimate below too)
        checked_cap(request.max_cost, settings.max_cost_limit_usd)
    except EngineError as exc:
        fail(str(exc))
    calibration = None
    if calibrated:  # what finished runs measured: the snapshot the engine writes, no database opened
        from bot.engine.outcome.calibration import read_snapshot
        from bot.planner.inputs import calibrate

        measurements = read_snapshot(settings.data_dir)
        calibration = calibrate(measurements) if measurements else None
    live = [] if offline else configured_clouds()
    providers = build_providers(settings)  # what `tunebot launch` (bot/engine/service.Engine) launches on
    try:
        if providers:
            from bot.engine.launching.offers import priced_estimate

            if live and not as_json:  # progress: a slow cloud may keep this waiting up to the deadline
                typer.echo(
                    f"Asking {', '.join(live)} for live prices (at most {settings.catalog_deadline_s:g} s; "
                    "--offline for the snapshot)…",
                    err=True,
                )
            result = priced_estimate(settings, providers, request, calibration=calibration, offline=offline)
        else:  # nothing here can launch: every cloud's snapshot, "prices: snapshot as of <date>"
            result = snapshot_estimate(request, calibration=calibration, settings=settings)
            from bot.engine.launching.offers import local_note

            wanted = settings.local_provider is not False
            absent = local_note(settings, providers, request) if wanted else None
            if absent:
                result.assumptions.append(f"prices: {absent}")
    except PlanningError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    _print_estimate(result)


def _estimate_command() -> Callable[..., None]:
    from bot.commands.request_cli import request_command

    extra = [
        inspect.Parameter(
            "as_json",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(False, "--json", help="Print the stable JSON contract."),
        ),
        inspect.Parameter(
            "calibrated",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(
                True,
                "--calibrated/--physics-only",
                help="Apply what finished runs measured (tunebot calibrate show), or the physics alone.",
            ),
        ),
        inspect.Parameter(
            "offline",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(
                False,
                "--offline",
                help="Price from the dated offline snapshot only, without "
                "asking the clouds whose keys are set.",
            ),
        ),
    ]
    return request_command(
        _estimate,
        extra,
        "Estimate memory, time and total cost of a fine-tune, and rank "
        "GPU offers. Options as flags or as key=value (like /tune).",
    )


def _print_estimate(est: Estimate) -> None:
    """The estimate card Slack and the console show, in its detailed form: the memory breakdown table,
    step time, calibration, fitting and rejected offers, every assumption (bot/chat/cards.py)."""
    from bot.chat.cards import estimate_reply
    from bot.chat.terminal import cli_console, render

    render(estimate_reply(est, estimate_id=None, detailed=True), cli_console())


def gpus_command(
    named: str | None = typer.Argument(None, metavar="[GPU]", help="Only this GPU (as `/tune gpus GPU`)."),
    live: bool = typer.Option(False, "--live", help="Ask the providers' APIs (keys from the environment)."),
    gpu: str | None = typer.Option(None, "--gpu", help="Only this GPU."),
    as_json: bool = typer.Option(False, "--json", help="Print the offers as JSON."),
) -> None:
    """The GPU price catalog: every provider's offers, on-demand and interruptible."""
    from bot.planner.errors import PlanningError
    from bot.planner.gpus import gpu as lookup_gpu

    gpu = gpu or named
    name = None
    if gpu:
        try:
            name = lookup_gpu(gpu).name
        except PlanningError as exc:
            fail(str(exc))
    if live:
        from bot.engine.launching.offers import price_list
        from bot.providers.registry import build_providers, configured_clouds
        from bot.settings import get_settings

        settings = get_settings()
        asking = configured_clouds()
        if asking:  # progress: a slow cloud may keep this waiting up to the deadline
            typer.echo(
                f"Asking {', '.join(asking)} for live prices (at most {settings.catalog_deadline_s:g} s)…",
                err=True,
            )
        prices = price_list(settings, build_providers(settings, include_local=False), gpu=name)
    else:
        from bot.engine.api import PriceList
        from bot.providers.snapshot import snapshot_as_of, snapshot_offers

        prices = PriceList(offers=snapshot_offers(), source="snapshot", as_of=snapshot_as_of())
    if as_json:
        import json

        offers = [o for o in prices.offers if name is None or o.gpu == name]
        offers.sort(key=lambda o: (o.gpu, o.gpu_count, o.price_per_hour))
        typer.echo(json.dumps([o.model_dump(mode="json") for o in offers], indent=2))
        return
    from bot.chat.cards import gpus_reply
    from bot.chat.terminal import cli_console, render

    render(gpus_reply(prices, name, detailed=True), cli_console())


def register(app: typer.Typer) -> None:
    """Add `estimate` and `gpus` to the app."""
    app.command("estimate")(_estimate_command())
    app.command("gpus")(gpus_command)
