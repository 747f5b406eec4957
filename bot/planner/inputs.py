"""The planner's only I/O: what one request needs from outside, resolved once and handed to estimate().

Everything else in bot/planner is pure (plan.estimate reads no file, network, environment or registry).
Here, once per request: the model's config (the built-in table, a config.json, or the Hub: models.py), its
LoRA targets resolved against it, and the dataset - its format from the first record, its tokens counted
with the runner's own rules (data_plan.py) or approximated (tokens.py), its size on disk. The engine's
bot/engine/launching/offers.py (every door: Slack, the console, `tunebot estimate` and `tunebot launch`) calls
resolve_inputs; scripts, benches and tests without an engine call plan_request.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from bot.planner.errors import BadRequestError, PlanningError
from bot.planner.gpus import known as known_device
from bot.planner.models import resolve, table_lookup
from bot.planner.plan import check_request, conditioned_cpu, estimate, predicted
from bot.planner.request import EstimateRequest
from bot.planner.resolved import DEFAULT_TOKENS, DataPlan, PlanInputs

if TYPE_CHECKING:
    from bot.planner.calibration import Calibration, Measurement, Predicted
    from bot.planner.offer import Offer
    from bot.planner.result import Estimate


class _Count(NamedTuple):
    tokens: int
    source: str
    data: DataPlan | None
    dataset_format: str | None


def resolve_inputs(request: EstimateRequest) -> PlanInputs:
    """The model and the dataset of ``request``, each read once. Raises PlanningError (safe to show) in the
    order a person fixes them: the request itself, the model, its LoRA targets, then the dataset."""
    check_request(request)
    arch, source = resolve(request.model)
    if request.method != "full":
        arch = arch.adapt(request.lora_targets)  # the one resolution of this request's targets
    hit = table_lookup(request.model) if source == "built-in table" else None
    try:
        count = _count(request)
    except PlanningError:
        raise
    except Exception as exc:  # storage errors (no credentials, denied, missing) are the request's, not ours
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        raise BadRequestError(
            f"cannot read dataset {request.dataset}: {type(exc).__name__}: {reason}".rstrip(": ")
        ) from None
    return PlanInputs(
        arch=arch,
        model_source=source,
        config_of=hit.config_of if hit else None,
        tokens=count.tokens,
        token_source=count.source,
        data=count.data,
        dataset_format=count.dataset_format,
        dataset_bytes=_dataset_bytes(request.dataset),
    )


def _count(req: EstimateRequest) -> _Count:
    """The dataset counted with the runner's own rules when the model's tokenizer is at hand, else tokens= /
    the character approximation / the default."""
    if req.tokens:
        return _Count(req.tokens, "tokens=", None, None)
    if not req.dataset:
        return _Count(DEFAULT_TOKENS, "default", None, None)
    from bot.planner.data_plan import plan_data
    from bot.planner.tokens import count_tokens

    fmt = dataset_format(req.dataset, req.dataset_format)
    data = plan_data(req, fmt)
    if data is not None:
        return _Count(sum(data.train_lengths), data.source, data, fmt)
    tokens, _, source = count_tokens(req.dataset, req.model)
    return _Count(tokens, source, None, fmt)


def _dataset_bytes(dataset: str | None) -> int | None:
    """A local dataset file's size (its copy on the host's disk); None for a URI or an unreadable path."""
    if not dataset or "://" in dataset:
        return None
    try:
        return Path(dataset).expanduser().stat().st_size
    except (OSError, ValueError):
        return None


def dataset_format(path: str, given: str) -> str:
    """The format of a dataset: as given, else what its first record's keys say (runner.contract.records
    rules)."""
    if given != "auto":
        return given
    from bot.planner.tokens import dataset_limits
    from runner.contract.reading import DatasetError, read_lines
    from runner.contract.records import detect_format

    try:  # the first record only, read in bounded chunks (a 300 MB first line is refused, not held)
        first = next(read_lines(path, dataset_limits().with_records(1)), None)
    except DatasetError as exc:
        raise BadRequestError(f"cannot read dataset: {exc}") from None
    if first is None:
        raise BadRequestError(f"dataset {path} has no examples")
    try:
        fmt = detect_format(json.loads(first[1]))
    except (json.JSONDecodeError, RecursionError):
        raise BadRequestError(f"{path}:{first[0]} is not valid JSON") from None
    if fmt is None:
        raise BadRequestError(
            f"{path}:1: cannot tell the dataset format from its keys; expected alpaca (instruction, output), "
            "messages, prompt/completion or text, or give format=..."
        )
    return fmt.value


def plan_request(
    request: EstimateRequest,
    *,
    offers: list[Offer],
    prices_source: str = "snapshot",
    prices_as_of: datetime | None = None,
    calibration: Calibration | None = None,
) -> Estimate:
    """resolve_inputs, then estimate(): the whole planner for a caller without live prices (`tunebot estimate
    --offline` through bot/engine/launching/offers.snapshot_estimate, scripts, benches, tests). The caller
    hands the offers in (the dated snapshot's: bot.providers.snapshot): the planner never asks a cloud."""
    inputs = resolve_inputs(request)
    return estimate(
        request,
        inputs,
        offers=offers,
        prices_source=prices_source,
        prices_as_of=prices_as_of,
        calibration=calibration,
    )


def predict_measurement(m: Measurement) -> Predicted | None:
    """The physics' figures for a measured run's configuration on its GPU (calibration.build's predictor):
    its model resolved here, the figures from plan.predicted."""
    try:
        req = EstimateRequest(**{**m.request, "gpus": m.gpus, "gpu": None})
        device = known_device(m.gpu)
        if device is None:
            return None
        if device.kind == "cpu":
            if not m.device:  # recorded before the CPU's conditions were kept: no physics to hold it to
                return None
            device = conditioned_cpu(m.device)  # the CPU as the run had it (its quote's: plan.cpu_share)
        arch, _ = resolve(req.model)
    except (PlanningError, ValueError, TypeError):
        return None
    return predicted(arch, req, device, m.gpus)


def calibrate(measurements: list[Measurement]) -> Calibration:
    """Corrections from finished runs, predicted with this planner's physics."""
    from bot.planner.calibration import build

    return build(measurements, predict_measurement)
