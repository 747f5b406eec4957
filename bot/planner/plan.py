"""`estimate()`: the whole planner for one request - model, memory, speed, time, ranked offers.

Pure: no network, no files, no environment, no provider registry. What it needs from outside (the model's
config, the dataset's tokens, format and size) comes in as PlanInputs, resolved once per request by
bot/planner/inputs.py (the planner's only I/O); the offers come in as an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from bot.money import cap_covering, money
from bot.planner.architectures import Architecture
from bot.planner.batch_choice import BatchChoice, as_asked, choose
from bot.planner.calibration import Calibration, Correction, Predicted, within_roofline
from bot.planner.disk import DiskNeed, disk_need
from bot.planner.errors import BadRequestError, PlanningError
from bot.planner.gpus import CPU, DEFAULT_CPU_CORES, GPU, GPUS, cpu_device
from bot.planner.gpus import gpu as lookup_gpu
from bot.planner.gpus import known as known_device
from bot.planner.length import RunTime, Timing
from bot.planner.memory import GB, MemoryResult, estimate_memory, qlora_upcast
from bot.planner.offer import Offer
from bot.planner.options import suggest
from bot.planner.phases import import_seconds, save_seconds
from bot.planner.ranges import (
    hours_range,
    memory_classes,
    memory_range,
    memory_ratio,
    speed_range,
    speed_ratio,
)
from bot.planner.rank import SAFETY_MARGIN, JobShape, rank_offers
from bot.planner.request import EstimateRequest
from bot.planner.resolved import DEFAULT_TOKENS, PlanInputs
from bot.planner.result import (
    DiskEstimate,
    Estimate,
    MemoryEstimate,
    ModelInfo,
    RankedOffer,
    SpeedEstimate,
    TimeEstimate,
    TrainingPlan,
)
from bot.planner.speed import SpeedResult, estimate_speed
from bot.planner.training import training_plan
from runner.contract.spec import Defaults

__all__ = ["DEFAULT_TOKENS", "PlanInputs", "check_request", "estimate"]


def check_request(req: EstimateRequest) -> None:
    """BadRequestError for what no input can fix (run before anything is read, and again by estimate())."""
    if req.dataset and req.tokens:
        raise BadRequestError("give either a dataset or tokens=, not both")
    if req.gpu:
        lookup_gpu(req.gpu)
    if req.method != "full" and req.lora_r > 1024:
        raise BadRequestError(f"LoRA rank {req.lora_r} is absurd; ranks of 4-256 are usual")


def _run_time(arch: Architecture, req: EstimateRequest, inputs: PlanInputs) -> RunTime:
    """The run's length: the dataset counted with the runner's own rules when the model's tokenizer was at
    hand, else tokens= / the character approximation / the default, every row assumed full."""
    return RunTime(arch, req, tokens=inputs.tokens, token_source=inputs.token_source, data=inputs.data)


def on_cpu(arch: Architecture, req: EstimateRequest, gpus: int = 1) -> MemoryResult:
    """Memory of the runner on a CPU (the local provider): everything in fp32 (runner/model.py), in host RAM,
    with no CUDA context, NCCL buffers or cuBLAS workspace, and no autocast (runner/model.uses_autocast)."""
    cpu_req = req.model_copy(update={"precision": "fp32", "adapter_dtype": "fp32", "autocast": False})
    mem = estimate_memory(arch, cpu_req, gpus)
    breakdown = {k: v for k, v in mem.breakdown.items() if k not in ("cuda_context", "cublas_workspace")}
    return replace(mem, per_gpu_bytes=sum(breakdown.values()), breakdown=breakdown)


def _disk(
    arch: Architecture, req: EstimateRequest, mem: MemoryResult, tokens: int, size: int | None
) -> DiskNeed:
    """The host's disk for this job (bot/planner/disk.py); a local dataset file counts with its size."""
    return disk_need(
        parameters=arch.parameters,
        trainable=mem.trainable,
        checkpoint_bytes=mem.checkpoint_bytes,
        method=req.method,
        merge=req.merge,
        tokens=tokens,
        dataset_bytes=size,
    )


def local_offer(offers: list[Offer]) -> Offer | None:
    """This machine's CPU among the offers (the local provider's), None when it is not offered."""
    return next((o for o in offers if o.gpu == CPU.name), None)


def cpu_conditions(local: Offer, req: EstimateRequest, *, starting: bool = False) -> dict[str, float]:
    """gpus.cpu_device's arguments for one run of ``req`` on the local offer ``local`` (``cpu_share``); kept
    with a finished run's measurement, so that the physics it is compared with is the quote's."""
    importer = starting and local.prewarm_after is not None and local.prewarm_after < req.runs_at_once
    conditions = {
        "cores": float(local.cpu_cores or DEFAULT_CPU_CORES),
        "runs": max(local.runs_here, local.cpu_busy) + req.runs_at_once + (1.0 if importer else 0.0),
        "threads": float(local.cpu_threads or 0),
        "speed": local.cpu_speed or 1.0,
    }
    measured = {"start_s": local.start_seconds, "fork_s": local.fork_seconds}
    return {**conditions, **{k: v for k, v in measured.items() if v}}


def conditioned_cpu(conditions: dict[str, float]) -> GPU:
    """The CPU ``cpu_conditions`` describe."""
    return cpu_device(
        int(conditions.get("cores") or DEFAULT_CPU_CORES),
        float(conditions.get("runs") or 1.0),
        threads=int(conditions.get("threads") or 0) or None,
        speed=float(conditions.get("speed") or 1.0),
        start_s=conditions.get("start_s") or None,
        fork_s=conditions.get("fork_s") or None,
    )


def cpu_share(offers: list[Offer], req: EstimateRequest, *, starting: bool = False) -> GPU:
    """This machine's CPU (the local provider's offer) for one run of ``req``: its cores shared with what
    already runs there (tunebot's runs, or the cores' worth other work kept busy lately when that is more: on
    9a0c9c1 every local quote was 1.5-8x low with other work on the cores) and with the request's other runs
    at once (a sweep's). ``starting``: as the runs' start-up gets it, shared also with the prewarmed process
    one of their launches starts (its imports beside theirs: a sweep of four on 2 cores started in 18.8 s
    where its four imports alone take 14)."""
    local = local_offer(offers)
    if local is None:
        return CPU
    return conditioned_cpu(cpu_conditions(local, req, starting=starting))


def _headline_phases(ranked: list[RankedOffer], gpu: str, gpus: int) -> dict[str, float] | None:
    """The quote by phase on the card's offer: the best fitting offer of the card's GPU."""
    for o in ranked:
        if o.fits and o.gpu == gpu and o.gpu_count == gpus:
            return o.phases
    return None


def _fits_anywhere(mem_gb: float, gpus: list[str], upper: float) -> str | None:
    best = [g for g in gpus if mem_gb * upper * (1 + SAFETY_MARGIN) <= GPUS[g].memory_gb]
    return min(best, key=lambda g: GPUS[g].memory_gb) if best else None


ONE_HOST_MAX = 8  # the runner trains on one host (runner/distributed.py): no offer is sold with more GPUs
_GPU_COUNTS = (1, 2, 4, ONE_HOST_MAX)  # the counts a suggestion of more GPUs tries


class _Fitter:
    """Where a variant of the request fits: the smallest GPU type among ``sold`` that holds it (None: none),
    and the GB per GPU it needs. A full fine-tune's LoRA alternatives resolve their targets once."""

    def __init__(self, arch: Architecture, sold: list[str]) -> None:
        self.arch = arch
        self.sold = sold
        self._adapted: Architecture | None = None

    def model_for(self, r: EstimateRequest) -> Architecture:
        if r.method == "full":
            return self.arch
        if self._adapted is None:
            self._adapted = self.arch.adapt(r.lora_targets)
        return self._adapted

    def __call__(self, r: EstimateRequest, gpus: int | None = None) -> tuple[str | None, float]:
        m = estimate_memory(self.model_for(r), r, gpus).per_gpu_gb
        return _fits_anywhere(m, self.sold, memory_ratio(r, gpus)[1]), m


def suggestions(arch: Architecture, req: EstimateRequest, offers: list[Offer]) -> list[str]:
    """What would fit when the memory does not: more GPUs (of a GPU type that is sold), LoRA instead of a
    full fine-tune, QLoRA, checkpointing, a smaller micro-batch, shorter sequences, a bigger GPU. Every
    suggestion was priced here and fits a GPU type that is sold; what would need more GPUs than one host has
    (ONE_HOST_MAX) is said as such, not suggested."""
    sold = sorted({o.gpu for o in offers if o.gpu in GPUS} or set(GPUS), key=lambda g: GPUS[g].memory_gb)
    fits = _Fitter(arch, sold)
    if req.gpu == CPU.name and not any(o.gpu == CPU.name for o in offers):  # no local provider here
        where, m = fits(req.model_copy(update={"gpu": None}))
        rent = f": {where} holds it ({m:.1f} GB)" if where else ""
        return [f"no CPU offer here (only the local provider runs on this machine's CPU): drop gpu=cpu{rent}"]
    out = _bigger_gpu(req, fits)
    more = _more_gpus(req, fits)
    out += more
    said = [] if more else _beyond_one_host(req, fits)  # not suggestions: what would need more than one host
    out += _lighter_training(req, fits)
    if not out:
        out.append(
            f"nothing in the catalog fits even with QLoRA on {ONE_HOST_MAX} GPUs; pick a smaller model"
        )
    return out + said


def _bigger_gpu(req: EstimateRequest, fits: _Fitter) -> list[str]:
    """A bigger GPU than the one asked for, when one that is sold holds the job."""
    if req.gpu:
        where, m = fits(req)
        if where and where != req.gpu:
            return [f"a bigger GPU: {where} ({m:.1f} GB per GPU needed)"]
    return []


def _more_gpus(req: EstimateRequest, fits: _Fitter) -> list[str]:
    """The fewest GPUs on one host (more than asked for) that hold the job with FSDP."""
    for n in [c for c in _GPU_COUNTS if c > req.gpus]:
        where, m = fits(req.model_copy(update={"gpus": n}), n)
        if where:
            return [f"more GPUs: {suggest('gpus', n)} (FSDP) on {where}, {m:.1f} GB per GPU"]
    return []


def _beyond_one_host(req: EstimateRequest, fits: _Fitter) -> list[str]:
    """What more GPUs than one host has would need: said, not suggested (the runner trains on one host)."""
    for n in (2 * max(req.gpus, ONE_HOST_MAX), 4 * max(req.gpus, ONE_HOST_MAX)):
        r = req.model_copy(update={"gpus": n})
        m = estimate_memory(fits.model_for(r), r, n).per_gpu_gb
        if _fits_anywhere(m, list(GPUS), memory_ratio(r, n)[1]):
            return [
                f"{n} GPUs would need {m:.1f} GB per GPU, but no offer has more than {ONE_HOST_MAX} GPUs "
                "and the runner trains on one host (no multi-node, no CPU offload)"
            ]
    return []


def _lighter_training(req: EstimateRequest, fits: _Fitter) -> list[str]:
    """Lighter ways to train the same job that fit: LoRA, QLoRA, activation checkpointing, a micro-batch of
    one, shorter sequences."""
    out: list[str] = []
    if req.method == "full":
        where, m = fits(req.for_method("lora"))
        if where:
            out.append(f"LoRA: {suggest('method', 'lora')} needs {m:.1f} GB per GPU on {where} x{req.gpus}")
    if req.method != "qlora":
        where, m = fits(req.for_method("qlora"))
        if where:
            on = f"{where} x{req.gpus}" if req.gpus > 1 else f"one {where}"
            out.append(f"QLoRA: {suggest('method', 'qlora')} needs {m:.1f} GB per GPU on {on}")
    if not req.gradient_checkpointing:
        where, m = fits(req.model_copy(update={"gradient_checkpointing": True}))
        if where:
            on = suggest("gradient_checkpointing", True)
            out.append(f"activation checkpointing: {on} needs {m:.1f} GB ({where})")
    if req.batch_size > 1:
        r = req.model_copy(update={"batch_size": 1, "grad_accum": req.grad_accum * req.batch_size})
        where, m = fits(r)
        if where:
            out.append(
                f"{suggest('batch_size', 1)} {suggest('grad_accum', r.grad_accum)} needs {m:.1f} GB ({where})"
            )
    return out + _shorter_sequences(req, fits)


def _shorter_sequences(req: EstimateRequest, fits: _Fitter) -> list[str]:
    """The longest of half, a quarter, ... of the sequence length (256 tokens at least) that fits."""
    seq = req.seq_len // 2
    while seq >= 256:
        where, m = fits(req.model_copy(update={"seq_len": seq}))
        if where:
            return [f"shorter sequences: {suggest('seq_len', seq)} needs {m:.1f} GB ({where})"]
        seq //= 2
    return []


def budget_suggestions(offers: list[Offer], job: JobShape, req: EstimateRequest, steps: int) -> list[str]:
    """When offers fit but all cost more than max_cost: the cost limit that covers the cheapest of them, and
    a shorter run (fewer steps) that fits the limit, each priced here; [] when the cost limit is not the
    reason."""
    if req.max_cost is None:
        return []
    free, n_free, _ = rank_offers(
        offers, job, gpus=req.gpus, gpu=req.gpu, interruptible=req.interruptible, keep_fits=1, keep_rejected=0
    )
    if not n_free:
        return []  # memory, capacity class or disk: the memory suggestions apply
    best = free[0]
    kind = "spot" if best.interruptible else "on-demand"
    where = f"{best.provider} {best.gpu} x{best.gpu_count} ({kind})"
    top = best.total_cost_range[1] if best.total_cost_range else best.total_cost
    out = [
        f"a higher cost limit: {suggest('max_cost', cap_covering(best.total_cost))} covers the "
        f"cheapest offer that fits, {where}, expected {money(best.total_cost)} (up to {money(top)})"
    ]
    share = req.max_cost / best.total_cost
    for factor in (0.9, 0.75, 0.5, 0.25):
        n = int(steps * share * factor)
        if n < 1 or n >= steps:
            continue
        shorter = replace(job, hours=lambda g, c, n=n: job.hours(g, c) * n / steps)
        fit, k, _ = rank_offers(
            offers,
            shorter,
            gpus=req.gpus,
            gpu=req.gpu,
            interruptible=req.interruptible,
            max_cost=req.max_cost,
            keep_fits=1,
            keep_rejected=0,
        )
        if k:
            o = fit[0]
            out.append(
                f"a shorter run: {suggest('max_steps', n)} (of {steps}) fits {money(req.max_cost)}: expected "
                f"{money(o.total_cost)} on {o.provider} {o.gpu} x{o.gpu_count}"
            )
            break
    return out


def risk_warnings(req: EstimateRequest) -> list[str]:
    """Settings the person chose that are known to go wrong, said on the card (the defaults never are)."""
    out: list[str] = []
    if req.method == "full" and req.learning_rate > 1e-4:
        out.append(
            f"learning rate {req.learning_rate:g} is a LoRA rate: a full fine-tune moves every weight and "
            "usually uses 1e-5 to 5e-5 "
            f"({suggest('learning_rate', Defaults.full_learning_rate)} is the default); this high a rate can "
            "wreck what the model already knew"
        )
    if req.method == "full" and req.precision == "bf16":
        out.append(
            "pure bf16 full fine-tune: weight updates smaller than bf16's resolution (about 1/256 of a "
            "weight) are rounded away, so training stalls as the learning rate decays; precision=mixed (the "
            "default) keeps fp32 master weights, at 16 instead of 8 bytes per parameter"
        )
    if req.method != "full" and req.learning_rate < 1e-5:
        out.append(
            f"learning rate {req.learning_rate:g} is very low for LoRA adapters, which start at zero "
            f"({suggest('learning_rate', Defaults.learning_rate)} is the default): they may barely move"
        )
    return out


def _method_note(arch: Architecture, req: EstimateRequest, mem: MemoryResult) -> str:
    kept = arch.parameters - arch.block_linear_params
    if req.method == "qlora":
        fmt = "NF4 + double quantization (0.516 B/param)" if req.double_quant else "NF4 (0.5625 B/param)"
        dtype = "fp32 (prepare_model_for_kbit_training)" if qlora_upcast(req, req.gpus) else "bf16"
        text = (
            f"QLoRA: {arch.block_linear_params:,} Linear parameters in the blocks as {fmt}; embeddings, "
            f"lm_head and norms ({kept:,}) in {dtype}"
        )
    elif req.method == "lora":
        text = f"LoRA: frozen base in {'fp32' if req.precision == 'fp32' else 'bf16'}"
    else:
        text = {
            "bf16": "full fine-tune in pure bf16 (weights 2 + grads 2 + AdamW states 4 B/param)",
            "mixed": "full fine-tune in mixed precision (fp32 master weights 4 + fp32 grads 4 + fp32 AdamW 8 "
            "= 16 B/param, plus the bf16 copies autocast makes while they are in use)",
            "fp32": "full fine-tune in fp32 (16 B/param)",
        }[req.precision]
    if req.method != "full":
        targets = req.lora_targets if isinstance(req.lora_targets, str) else ",".join(req.lora_targets)
        text += f"; adapters r={req.lora_r} on {targets}: {mem.trainable:,} trainable ({req.adapter_dtype})"
    text += f"; optimizer {req.optimizer}"
    text += "; activation checkpointing" if req.gradient_checkpointing else "; no activation checkpointing"
    return text + f"; attention {req.attn}"


def predicted(arch: Architecture, req: EstimateRequest, device: GPU, gpus: int) -> Predicted | None:
    """The physics' figures for a measured run's configuration on its GPU (inputs.predict_measurement, which
    resolves the model, hands them to calibration.build), with the bounds its claims are held to (the
    roofline, what the GPU holds); None when the planner cannot price it."""
    try:
        if req.method != "full":
            arch = arch.adapt(req.lora_targets)
        mem = estimate_memory(arch, req, gpus)
        speed = estimate_speed(arch, req, device, gpus)
    except (PlanningError, ValueError, TypeError):
        return None
    return Predicted(
        mem.torch_reserved_gb,
        speed.tokens_per_second,
        req.stack,
        req.method,
        float(arch.parameters),
        speed.mfu,
        device.memory_gb or None,
    )


def _corrected_memory(mem: MemoryResult, corr: Correction | None) -> float:
    """Peak GB per GPU with a calibration's factor on what torch reserves (not on the CUDA context)."""
    if corr is None or not corr.memory_runs:
        return mem.per_gpu_gb
    return (mem.per_gpu_bytes + (corr.memory_factor - 1.0) * mem.torch_reserved_gb * GB) / GB


def _corrected_speed(speed: SpeedResult, corr: Correction | None) -> SpeedResult:
    if corr is None or not corr.speed_runs:
        return speed
    f = within_roofline(corr.speed_factor, speed.mfu)  # no calibration promises more than the matmul rate
    return SpeedResult(
        speed.tokens_per_second * f,
        speed.step_seconds / f,
        speed.micro_step_seconds / f,
        speed.mfu * f,
        speed.flops_per_token,
        speed.parts,
    )


@dataclass(frozen=True)
class _Headline:
    """The GPU the card's figures are shown on, and those figures (calibrated where runs taught them)."""

    gpu: str
    fits: bool  # False: nothing fits and neither does this GPU at this count; its time is a "what if"
    device: GPU
    corr: Correction | None
    timing: Timing
    mfu_peak: float  # model FLOPs over the GPUs' peak dense rate
    cpu: bool
    mem: MemoryResult  # on a CPU: the runner's fp32 memory in host RAM
    mem_gb: float
    breakdown: dict[str, float]


def estimate(
    request: EstimateRequest,
    inputs: PlanInputs,
    *,
    offers: list[Offer],
    prices_source: str = "snapshot",
    prices_as_of: datetime | None = None,
    calibration: Calibration | None = None,
) -> Estimate:
    """Everything `tunebot estimate` shows: raises PlanningError (safe to show) on bad input. Reads nothing:
    ``inputs`` is inputs.resolve_inputs(request), ``offers`` every offer to rank.

    `calibration` (from finished runs, see calibration.py) moves memory and speed for the GPUs it has evidence
    on; without it the estimate is the physics alone."""
    req = _checked(request)
    arch, source = inputs.arch, inputs.model_source
    if req.method != "full":
        arch = arch.adapt(req.lora_targets)  # resolved once (by resolve_inputs already: then a no-op)
    mem = estimate_memory(arch, req)
    run = _run_time(arch, req, inputs)
    run.check(req.gpus)
    run.cpu = cpu_share(offers, req)  # this machine's CPU as much of it as a run started now gets
    run.cpu_start = cpu_share(offers, req, starting=True)  # ... and as its start-up gets it
    correction = _correction_lookup(calibration or Calibration(), req, arch)
    mem_ratio, speed_ratios = memory_ratio(req), speed_ratio(req)
    disk = _disk(arch, req, mem, run.tokens, inputs.dataset_bytes)
    splits = _Splits(arch, req, inputs, run, mem, correction)
    job = _job_shape(arch, req, mem, run, disk, correction, splits)
    ranked, n_fit, _ = rank_offers(
        offers, job, gpus=req.gpus, gpu=req.gpu, interruptible=req.interruptible, max_cost=req.max_cost
    )
    local = local_offer(offers)
    if local is not None:  # the CPU the local quote priced: a finished run is held to the same physics
        conditions = cpu_conditions(local, req)
        ranked = [o.model_copy(update={"cpu": conditions}) if o.gpu == CPU.name else o for o in ranked]
    fitting = [o for o in ranked if o.fits]
    # The card's GPU trains the micro-batch, accumulation, checkpointing and loss chosen for it
    # (bot/planner/batch_choice.py); everything below is priced as that configuration.
    choice = splits.choice(_headline_gpu(req, mem, fitting), req.gpus)
    others = splits.others(fitting, choice)
    req = choice.apply(req) if choice.chosen else req
    mem, run = splits.memory(req, req.gpus), splits.run(req)
    head = _headline(arch, req, mem, run, fitting, correction)
    mem = head.mem
    timing, speed = head.timing, head.timing.speed
    assumptions = _assumptions(arch, source, req, inputs, run, disk, head)
    sugg = (
        []
        if n_fit
        else (budget_suggestions(offers, job, req, timing.steps) or suggestions(arch, req, offers))
    )
    return Estimate(
        model=ModelInfo(
            name=arch.name,
            architecture=arch.model_type,
            parameters=arch.parameters,
            active_parameters=arch.active_parameters,
            trainable_parameters=mem.trainable,
            layers=arch.layers,
            hidden_size=arch.hidden,
            vocab_size=arch.vocab,
            source=source,
        ),
        method=req.method,
        memory=MemoryEstimate(
            per_gpu_gb=round(head.mem_gb, 3),
            breakdown_gb=head.breakdown,
            gpus=req.gpus,
            sharding=mem.sharding,
            per_gpu_gb_range=[round(v, 3) for v in memory_range(head.mem_gb, mem_ratio)],
        ),
        speed=SpeedEstimate(
            gpu=head.gpu,
            gpus=req.gpus,
            tokens_per_second=round(speed.tokens_per_second, 2),
            step_seconds=round(speed.step_seconds, 4),
            mfu=round(head.mfu_peak, 4),
            matmul_share=round(speed.mfu, 4),
            fits=head.fits,
            flops_per_token=speed.flops_per_token,
            tokens_per_second_range=[round(v, 2) for v in speed_range(speed.tokens_per_second, speed_ratios)],
            calibrated_runs=head.corr.speed_runs if head.corr else 0,
            calibration=head.corr.describe() if head.corr else None,
        ),
        time=TimeEstimate(
            tokens=timing.tokens_per_epoch,
            epochs=round(timing.epochs, 4),
            steps=timing.steps,
            hours=round(timing.hours, 4),
            token_source=run.token_source,
            hours_range=[round(v, 4) for v in hours_range(timing.hours, speed_ratios)],
            steps_per_epoch=timing.steps_per_epoch,
            evaluations=timing.evaluations,
            eval_tokens=timing.eval_tokens,
            eval_hours=round(timing.eval_seconds / 3600.0, 6),
            samples=timing.samples,
            sample_tokens=timing.sample_tokens,
            sample_hours=round(timing.sample_seconds / 3600.0, 6),
            length=timing.describe,
            phases=_headline_phases(ranked, head.gpu, req.gpus),
        ),
        offers=ranked,
        assumptions=assumptions,
        suggestions=sugg,
        prices_as_of=prices_as_of,
        prices_source=prices_source,
        training=_training_plan(arch, req, mem, inputs, run, choice, others),
        warnings=risk_warnings(req),
        disk=DiskEstimate(gb=disk.gb, breakdown_gb=disk.breakdown()),
    )


def _checked(request: EstimateRequest) -> EstimateRequest:
    """The request checked (check_request), its GPU under its canonical name (aliases resolved)."""
    check_request(request)
    if request.gpu:
        return request.model_copy(update={"gpu": lookup_gpu(request.gpu).name})
    return request


def _correction_lookup(
    calibration: Calibration, req: EstimateRequest, arch: Architecture
) -> Callable[[str], Correction | None]:
    """What finished runs of this stack, method and size teach about a GPU (None: nothing yet)."""

    def correction(g: str) -> Correction | None:
        return calibration.lookup(g, req.stack, req.method, arch.parameters) if calibration else None

    return correction


class _Splits:
    """The batch choice on each (GPU, count) (bot/planner/batch_choice.py), and each chosen configuration's
    memory per GPU count and run length, worked out once. On the CPU, and where nothing is left to choose,
    the request's own configuration."""

    def __init__(
        self,
        arch: Architecture,
        req: EstimateRequest,
        inputs: PlanInputs,
        run: RunTime,
        mem: MemoryResult,
        correction: Callable[[str], Correction | None],
    ) -> None:
        self.arch, self.req, self.inputs, self.correction = arch, req, inputs, correction
        self._choices: dict[tuple[str, int], BatchChoice] = {}
        self._memory: dict[tuple[tuple, int], MemoryResult] = {(_split_key(req), req.gpus): mem}
        self._runs: dict[tuple, RunTime] = {_split_key(req): run}
        self._seconds: dict[tuple[tuple, str, int], float] = {}

    def memory(self, r: EstimateRequest, n: int) -> MemoryResult:
        key = (_split_key(r), n)
        if key not in self._memory:
            self._memory[key] = estimate_memory(self.arch, r, n)
        return self._memory[key]

    def run(self, r: EstimateRequest) -> RunTime:
        key = _split_key(r)
        if key not in self._runs:
            self._runs[key] = _run_time(self.arch, r, self.inputs)
        return self._runs[key]

    def choice(self, g: str, n: int) -> BatchChoice:
        key = (g, n)
        if key not in self._choices:
            self._choices[key] = self._choose(g, n)
        return self._choices[key]

    def others(self, offers: list[RankedOffer], main: BatchChoice) -> dict[str, list[Any]]:
        """Each offer's (GPU, count) choice where it differs from ``main`` (TrainingPlan.batch_by_gpu)."""
        out: dict[str, list[Any]] = {}
        for o in offers:
            c = self.choice(o.gpu, o.gpu_count)
            fields = [c.micro_batch_size, c.grad_accum, c.gradient_checkpointing, c.loss]
            mine = [main.micro_batch_size, main.grad_accum, main.gradient_checkpointing, main.loss]
            if c.chosen and fields != mine:
                out[f"{o.gpu}x{o.gpu_count}"] = fields
        return out

    def request(self, g: str, n: int) -> EstimateRequest:
        choice = self.choice(g, n)
        return choice.apply(self.req) if choice.chosen else self.req

    def _choose(self, g: str, n: int) -> BatchChoice:
        req = self.req
        if g == CPU.name or g not in GPUS:  # the local provider trains what was asked
            return as_asked(req)
        device, corr = GPUS[g], self.correction(g)

        def need(r: EstimateRequest) -> float:  # what ranking judges a fit by: the range's top, the margin
            return _corrected_memory(self.memory(r, n), corr) * memory_ratio(r, n)[1] * (1 + SAFETY_MARGIN)

        def seconds(r: EstimateRequest) -> float:
            key = (_split_key(r), g, n)
            if key not in self._seconds:
                self._seconds[key] = estimate_speed(self.arch, r, device, n).step_seconds
            return self._seconds[key]

        return choose(req, card=g, need_gb=need, capacity_gb=device.memory_gb, step_seconds=seconds)


def _split_key(r: EstimateRequest) -> tuple:
    return (r.batch_size, r.grad_accum, r.gradient_checkpointing, r.loss)


def _headline_gpu(req: EstimateRequest, mem: MemoryResult, fitting: list[RankedOffer]) -> str:
    """The GPU the card shows (as ``_headline`` picks it): the one asked for, the best fitting offer's, else
    the smallest that holds the job (h200 when none does)."""
    if req.gpu:
        return req.gpu
    if fitting:
        return fitting[0].gpu
    return _fits_anywhere(mem.per_gpu_gb, list(GPUS), memory_ratio(req)[1]) or "h200"


def _job_shape(
    arch: Architecture,
    req: EstimateRequest,
    mem: MemoryResult,
    run: RunTime,
    disk: DiskNeed,
    correction: Callable[[str], Correction | None],
    splits: _Splits | None = None,
) -> JobShape:
    """What ranking needs of the job on any GPU and count: memory (calibrated, on a CPU the runner's own),
    hours (calibrated speed), the ranges and the sizes to store and move; each count's memory and each
    (GPU, count)'s hours worked out once. ``splits``: each (GPU, count) priced with the micro-batch,
    accumulation, checkpointing and loss chosen for it (the request's own without)."""
    memo: dict[int, MemoryResult] = {req.gpus: mem}

    def memory_result(n: int) -> MemoryResult:
        if n not in memo:
            memo[n] = estimate_memory(arch, req, n)
        return memo[n]

    def memory_gb(n: int) -> float:
        return memory_result(n).per_gpu_gb

    def memory_on(g: str, n: int) -> float:
        if g == CPU.name:
            return on_cpu(arch, req, n).per_gpu_gb
        if splits is not None:
            return _corrected_memory(splits.memory(splits.request(g, n), n), correction(g))
        return _corrected_memory(memory_result(n), correction(g))

    speed_memo: dict[tuple[str, int], Timing] = {}

    def timing(g: str, n: int) -> Timing:
        key = (g, n)
        if key not in speed_memo:
            corr_g = correction(g)
            runs = splits.run(splits.request(g, n)) if splits is not None and g != CPU.name else run
            speed_memo[key] = runs.timing(known_device(g), n, lambda s: _corrected_speed(s, corr_g))
        return speed_memo[key]

    def hours(g: str, n: int) -> float:
        return timing(g, n).hours

    full = req.method == "full"
    output_gb = (arch.parameters * 2.0 if full else mem.trainable * 4.0) / GB
    mem_ratio = memory_ratio(req)
    return JobShape(
        memory_gb=memory_gb,
        memory_on=memory_on,
        memory_upper=mem_ratio[1],
        memory_lower=mem_ratio[0],
        hours_low_high=hours_range(1.0, speed_ratio(req)),
        hours=hours,
        checkpoint_gb=mem.checkpoint_bytes / GB,
        download_gb=mem.download_bytes / GB,
        output_gb=output_gb,
        disk_gb=disk.gb,
        **_by_phase(mem, timing, run.cpu, run.cpu_start),
    )


def _by_phase(
    mem: MemoryResult, timing: Callable[[str, int], Timing], cpu: GPU | None, cpu_start: GPU | None = None
) -> dict[str, Callable]:
    """What ranking needs to price a whole run by phase (bot/planner/phases.py): the runner's phases and its
    training loop on each (GPU, count), the runner process's start and one checkpoint save on each GPU
    (``cpu``: this machine's CPU as a run gets it; ``cpu_start``: as its start-up gets it)."""

    def device_of(g: str) -> GPU | None:
        return cpu if g == CPU.name and cpu is not None else known_device(g)

    def phases(g: str, n: int) -> dict[str, float]:
        return dict(timing(g, n).phases or {})

    def loop_hours(g: str, n: int) -> float:
        return timing(g, n).loop_hours

    def import_hours(g: str, warm: bool) -> float:
        device = cpu_start if g == CPU.name and cpu_start is not None else device_of(g)
        return import_seconds(device, warm=warm) / 3600.0 if device is not None else 0.0

    def save_hours(g: str) -> float:
        device = device_of(g)
        return save_seconds(mem.checkpoint_bytes, device) / 3600.0 if device is not None else 0.0

    return {
        "phases": phases,
        "loop_hours": loop_hours,
        "import_hours": import_hours,
        "save_hours": save_hours,
    }


def _headline(
    arch: Architecture,
    req: EstimateRequest,
    mem: MemoryResult,
    run: RunTime,
    fitting: list[RankedOffer],
    correction: Callable[[str], Correction | None],
) -> _Headline:
    """The GPU the card shows: the one asked for, else the best fitting offer's, else the smallest that
    holds the job (h200 when none does); its time, MFU and memory, calibrated."""
    upper = memory_ratio(req)[1]
    if req.gpu:
        gpu = req.gpu
    elif fitting:
        gpu = fitting[0].gpu
    else:
        gpu = _fits_anywhere(mem.per_gpu_gb, list(GPUS), upper) or "h200"
    # Nothing fits and the GPU the figures are shown on cannot hold the job at this count: its time is a "what
    # if", said so on the card (SpeedEstimate.fits), never passed off as this GPU's time.
    fits = (
        bool(fitting)
        or gpu == CPU.name
        or (gpu in GPUS and mem.per_gpu_gb * upper * (1 + SAFETY_MARGIN) <= GPUS[gpu].memory_gb)
    )
    device = lookup_gpu(gpu)
    corr = correction(gpu)
    timing = run.timing(device, req.gpus, lambda s: _corrected_speed(s, corr))
    speed = timing.speed
    # MFU as defined: model FLOPs over the GPUs' peak dense rate; the roofline's own figure is over the
    # measured matmul rate (a larger share of a smaller number), named for what it is
    mfu_peak = speed.mfu * device.matmul_tflops / device.dense_tflops if device.dense_tflops else speed.mfu
    cpu = gpu == CPU.name
    if cpu:  # the runner on this machine's CPU: fp32, host RAM, no CUDA context
        mem = on_cpu(arch, req, req.gpus)
    mem_gb = _corrected_memory(mem, corr)
    breakdown = mem.breakdown_gb()
    if corr is not None and corr.memory_runs:
        breakdown["calibration"] = round(mem_gb - mem.per_gpu_gb, 3)
    return _Headline(gpu, fits, device, corr, timing, mfu_peak, cpu, mem, mem_gb, breakdown)


def _assumptions(
    arch: Architecture,
    source: str,
    req: EstimateRequest,
    inputs: PlanInputs,
    run: RunTime,
    disk: DiskNeed,
    head: _Headline,
) -> list[str]:
    """What the figures assume, in the card's words: the model, memory, speed, length, interruptions, disk,
    the method, the ranges, then what applies to this job only."""
    mem, device, timing, cpu = head.mem, head.device, head.timing, head.cpu
    speed = timing.speed
    config_of = inputs.config_of
    shared = f" (config shared with {config_of})" if config_of and config_of != arch.name else ""
    assumptions = [
        f"model: {arch.name} from the {source}{shared}; {arch.parameters:,} parameters"
        + (f" ({arch.active_parameters:,} active per token, {arch.experts} experts)" if arch.experts else ""),
        (
            f"peak memory of the training process in host RAM at the {mem.peak_phase} (on a CPU the runner "
            "trains in fp32; no CUDA context)"
            if cpu
            else f"peak reserved memory per GPU at the {mem.peak_phase}; CUDA context included; "
            f"offers must fit with {SAFETY_MARGIN:.0%} to spare"
        )
        + "; GB = 10^9 bytes (a card sold as 24 GB has 24 GiB = 25.8 GB)",
        f"speed on {device.label} x{req.gpus}: {speed.flops_per_token / 1e9:.1f} GFLOP per token, MFU "
        f"{head.mfu_peak:.0%} of the {device.dense_tflops:g} TFLOPS bf16 dense peak ({speed.mfu:.0%} of the "
        f"{device.matmul_tflops:g} TFLOPS measured matmul rate; {req.stack} stack"
        + (", compiled" if req.compile else "")
        + ")"
        + ("" if head.fits else f"; it does not fit {device.label} x{req.gpus}: a time if it did"),
        f"length: {timing.describe} ("
        + (f"counted with the {run.token_source}" if run.data else f"tokens: {run.token_source}")
        + "); steps= is the number of optimizer "
        "steps trained (the data repeats as needed), else steps = ceil(epochs x steps per epoch)"
        + (f"; eval passes add {timing.eval_seconds / 60:.1f} min" if timing.evaluations else "")
        + (
            f"; {timing.samples} side-by-side answers (base and tuned, greedy, at most "
            f"{timing.sample_tokens} tokens) add {timing.sample_seconds / 60:.1f} min"
            if timing.samples
            else ""
        ),
        "interruptible offers: expected cost includes lost work and restarts with a Young/Daly checkpoint "
        "interval; storage is the disk asked for; egress the result download",
        f"disk: {disk.gb:.0f} GB asked on every host ("
        + ", ".join(f"{k} {v:.1f}" for k, v in disk.breakdown().items())
        + " GB: one checkpoint at a time on the host, the kept ones in object storage); a host offering "
        "less is rejected",
    ]
    noted = req.model_copy(update={"precision": "fp32", "adapter_dtype": "fp32"}) if cpu else req
    assumptions.append(_method_note(arch, noted, mem))
    if not cpu:
        assumptions.extend(mem.notes)  # the memory mechanisms assumed (bot/planner/memory.memory_notes)
    assumptions.append(_ranges_note(req))
    return assumptions + _job_notes(req, run, head)


def _ranges_note(req: EstimateRequest) -> str:
    """How wide the memory and speed ranges are, and where they come from."""
    (lo, hi), speed_ratios = memory_ratio(req), speed_ratio(req)
    classes = ", ".join(memory_classes(req)) or "no special class"
    return (
        f"ranges: memory x{lo:.2f}-{hi:.2f} ({classes}), speed x{speed_ratios[0]:.2f}-{speed_ratios[1]:.2f}: "
        "90% prediction intervals from the planner's errors on published sources it was not fitted on (leave "
        "one source out, per class of job); offers must fit the top"
    )


def _job_notes(req: EstimateRequest, run: RunTime, head: _Headline) -> list[str]:
    """The assumptions only some jobs carry: a calibration, several GPUs, memory kept off the GPU, no
    length given."""
    notes = []
    if head.corr is not None:
        notes.append(head.corr.describe())
    if req.gpus > 1:
        notes.append(
            f"{req.gpus} GPUs with FSDP full sharding: weights, gradients and optimizer states split, "
            "activations and logits per GPU; the GPUs talk over "
            f"{head.device.link or 'their interconnect'}"
        )
    if req.gpus > 1 and req.optimizer != "adamw":
        notes.append(f"warning: {req.optimizer} (bitsandbytes) breaks checkpoint saves under FSDP: use adamw")
    if head.mem.offloaded:
        notes.append(
            "kept off the GPU: " + ", ".join(f"{k} {v / GB:.1f} GB" for k, v in head.mem.offloaded.items())
        )
    if run.token_source == "default":
        notes.append(f"no dataset or tokens= given: assumed {DEFAULT_TOKENS:,} tokens")
    return notes


def _training_plan(
    arch: Architecture,
    req: EstimateRequest,
    mem: MemoryResult,
    inputs: PlanInputs,
    run: RunTime,
    choice: BatchChoice | None = None,
    others: dict[str, list[Any]] | None = None,
) -> TrainingPlan:
    """How the runner will train, with the held-out examples as counted (the automatic split decided by the
    data) and what the batch choice decided for the card's GPU, and why (and on the other offers' cards)."""
    plan = training_plan(arch, req, sharding=mem.sharding, dataset_format=inputs.dataset_format)
    if choice is not None and choice.chosen:
        plan = plan.model_copy(update={"batch_choice": choice.why, "batch_by_gpu": others or None})
    if run.data is not None:
        held = len(run.data.eval_lengths)
        plan = plan.model_copy(
            update={"eval_examples": held, "plateau_on": "eval loss" if held else "train loss"}
        )
    return plan
