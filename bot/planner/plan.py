"""`estimate()`: the whole planner for one request - model, memory, speed, time, ranked offers.

Pure: no network, no files, no environment, no provider registry. What it needs from outside (the model's
config, the dataset's tokens, format and size) comes in as PlanInputs, resolved once per request by
bot/planner/inputs.py (the planner's only I/O); the offers come in as an argument.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime

from bot.planner.architectures import Architecture
from bot.planner.calibration import Calibration, Correction
from bot.planner.disk import DiskNeed, disk_need
from bot.planner.errors import BadRequestError, PlanningError
from bot.planner.gpus import CPU, GPU, GPUS
from bot.planner.gpus import gpu as lookup_gpu
from bot.planner.gpus import known as known_device
from bot.planner.length import RunTime
from bot.planner.memory import GB, MemoryResult, estimate_memory, qlora_upcast
from bot.planner.offer import Offer
from bot.planner.options import suggest
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
from bot.planner.result import DiskEstimate, Estimate, MemoryEstimate, ModelInfo, SpeedEstimate, TimeEstimate
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


def _fits_anywhere(mem_gb: float, gpus: list[str], upper: float) -> str | None:
    best = [g for g in gpus if mem_gb * upper * (1 + SAFETY_MARGIN) <= GPUS[g].memory_gb]
    return min(best, key=lambda g: GPUS[g].memory_gb) if best else None


def _usd(value: float) -> str:
    """Dollars as the cards write them (bot/money.py; the planner imports nothing above it)."""
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


ONE_HOST_MAX = 8  # the runner trains on one host (runner/distributed.py): no offer is sold with more GPUs


def suggestions(arch: Architecture, req: EstimateRequest, offers: list[Offer]) -> list[str]:
    """What would fit when the memory does not: more GPUs (of a GPU type that is sold), LoRA instead of a
    full fine-tune, QLoRA, checkpointing, a smaller micro-batch, shorter sequences, a bigger GPU. Every
    suggestion was priced here and fits a GPU type that is sold; what would need more GPUs than one host has
    (ONE_HOST_MAX) is said as such, not suggested."""
    sold = sorted({o.gpu for o in offers if o.gpu in GPUS} or set(GPUS), key=lambda g: GPUS[g].memory_gb)
    counts = [1, 2, 4, ONE_HOST_MAX]
    out: list[str] = []
    adapted: dict[str, Architecture] = {}

    def model_for(r: EstimateRequest) -> Architecture:
        if r.method == "full":
            return arch
        if "targets" not in adapted:  # a full fine-tune's LoRA alternatives resolve their targets here, once
            adapted["targets"] = arch.adapt(r.lora_targets)
        return adapted["targets"]

    def fits(r: EstimateRequest, gpus: int | None = None) -> tuple[str | None, float]:
        m = estimate_memory(model_for(r), r, gpus).per_gpu_gb
        return _fits_anywhere(m, sold, memory_ratio(r, gpus)[1]), m

    if req.gpu == CPU.name and not any(o.gpu == CPU.name for o in offers):  # no local provider here
        where, m = fits(req.model_copy(update={"gpu": None}))
        rent = f": {where} holds it ({m:.1f} GB)" if where else ""
        return [f"no CPU offer here (only the local provider runs on this machine's CPU): drop gpu=cpu{rent}"]
    if req.gpu:
        where, m = fits(req)
        if where and where != req.gpu:
            out.append(f"a bigger GPU: {where} ({m:.1f} GB per GPU needed)")
    more = False
    for n in [c for c in counts if c > req.gpus]:
        where, m = fits(req.model_copy(update={"gpus": n}), n)
        if where:
            out.append(f"more GPUs: {suggest('gpus', n)} (FSDP) on {where}, {m:.1f} GB per GPU")
            more = True
            break
    said: list[str] = []  # not suggestions: what would need more than one host
    if not more:  # beyond one host: say it, do not suggest it
        for n in (2 * max(req.gpus, ONE_HOST_MAX), 4 * max(req.gpus, ONE_HOST_MAX)):
            r = req.model_copy(update={"gpus": n})
            m = estimate_memory(model_for(r), r, n).per_gpu_gb
            if _fits_anywhere(m, list(GPUS), memory_ratio(r, n)[1]):
                said.append(
                    f"{n} GPUs would need {m:.1f} GB per GPU, but no offer has more than {max(counts)} GPUs "
                    "and the runner trains on one host (no multi-node, no CPU offload)"
                )
                break
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
    seq = req.seq_len // 2
    while seq >= 256:
        where, m = fits(req.model_copy(update={"seq_len": seq}))
        if where:
            out.append(f"shorter sequences: {suggest('seq_len', seq)} needs {m:.1f} GB ({where})")
            break
        seq //= 2
    if not out:
        out.append(f"nothing in the catalog fits even with QLoRA on {max(counts)} GPUs; pick a smaller model")
    return out + said


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
        f"a higher cost limit: {suggest('max_cost', math.ceil(best.total_cost * 100) / 100)} covers the "
        f"cheapest offer that fits, {where}, expected {_usd(best.total_cost)} (up to {_usd(top)})"
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
                f"a shorter run: {suggest('max_steps', n)} (of {steps}) fits {_usd(req.max_cost)}: expected "
                f"{_usd(o.total_cost)} on {o.provider} {o.gpu} x{o.gpu_count}"
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


def predicted(
    arch: Architecture, req: EstimateRequest, device: GPU, gpus: int
) -> tuple[float | None, float | None, str, str, float] | None:
    """The physics' figures for a measured run's configuration on its GPU (inputs.predict_measurement, which
    resolves the model, hands them to calibration.build); None when the planner cannot price it."""
    try:
        if req.method != "full":
            arch = arch.adapt(req.lora_targets)
        mem = estimate_memory(arch, req, gpus)
        speed = estimate_speed(arch, req, device, gpus)
    except (PlanningError, ValueError, TypeError):
        return None
    return mem.torch_reserved_gb, speed.tokens_per_second, req.stack, req.method, float(arch.parameters)


def _corrected_memory(mem: MemoryResult, corr: Correction | None) -> float:
    """Peak GB per GPU with a calibration's factor on what torch reserves (not on the CUDA context)."""
    if corr is None or not corr.memory_runs:
        return mem.per_gpu_gb
    return (mem.per_gpu_bytes + (corr.memory_factor - 1.0) * mem.torch_reserved_gb * GB) / GB


def _corrected_speed(speed: SpeedResult, corr: Correction | None) -> SpeedResult:
    if corr is None or not corr.speed_runs:
        return speed
    f = corr.speed_factor
    return SpeedResult(
        speed.tokens_per_second * f,
        speed.step_seconds / f,
        speed.micro_step_seconds / f,
        speed.mfu * f,
        speed.flops_per_token,
        speed.parts,
    )


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
    req = request
    check_request(req)
    if req.gpu:
        req = req.model_copy(update={"gpu": lookup_gpu(req.gpu).name})  # aliases -> canonical names
    arch, source = inputs.arch, inputs.model_source
    if req.method != "full":
        arch = arch.adapt(req.lora_targets)  # resolved once (by resolve_inputs already: then a no-op)
    mem = estimate_memory(arch, req)
    run = _run_time(arch, req, inputs)
    run.check(req.gpus)

    memo: dict[int, MemoryResult] = {req.gpus: mem}
    calibration = calibration or Calibration()

    def correction(g: str) -> Correction | None:
        return calibration.lookup(g, req.stack, req.method, arch.parameters) if calibration else None

    def memory_result(n: int) -> MemoryResult:
        if n not in memo:
            memo[n] = estimate_memory(arch, req, n)
        return memo[n]

    def memory_gb(n: int) -> float:
        return memory_result(n).per_gpu_gb

    def memory_on(g: str, n: int) -> float:
        if g == CPU.name:
            return on_cpu(arch, req, n).per_gpu_gb
        return _corrected_memory(memory_result(n), correction(g))

    speed_memo: dict[tuple[str, int], float] = {}

    def hours(g: str, n: int) -> float:
        key = (g, n)
        if key not in speed_memo:
            corr_g = correction(g)
            speed_memo[key] = run.timing(known_device(g), n, lambda s: _corrected_speed(s, corr_g)).hours
        return speed_memo[key]

    full = req.method == "full"
    output_gb = (arch.parameters * 2.0 if full else mem.trainable * 4.0) / GB
    mem_ratio, speed_ratios = memory_ratio(req), speed_ratio(req)
    disk = _disk(arch, req, mem, run.tokens, inputs.dataset_bytes)
    job = JobShape(
        memory_gb=memory_gb,
        memory_on=memory_on,
        memory_upper=mem_ratio[1],
        memory_lower=mem_ratio[0],
        hours_low_high=hours_range(1.0, speed_ratios),
        hours=hours,
        checkpoint_gb=mem.checkpoint_bytes / GB,
        download_gb=mem.download_bytes / GB,
        output_gb=output_gb,
        disk_gb=disk.gb,
    )
    ranked, n_fit, _ = rank_offers(
        offers, job, gpus=req.gpus, gpu=req.gpu, interruptible=req.interruptible, max_cost=req.max_cost
    )

    fitting = [o for o in ranked if o.fits]
    if req.gpu:
        headline = req.gpu
    elif fitting:
        headline = fitting[0].gpu
    else:
        headline = _fits_anywhere(mem.per_gpu_gb, list(GPUS), mem_ratio[1]) or "h200"
    # Nothing fits and the GPU the figures are shown on cannot hold the job at this count: its time is a "what
    # if", said so on the card (SpeedEstimate.fits), never passed off as this GPU's time.
    headline_fits = (
        bool(fitting)
        or headline == CPU.name
        or (
            headline in GPUS
            and mem.per_gpu_gb * mem_ratio[1] * (1 + SAFETY_MARGIN) <= GPUS[headline].memory_gb
        )
    )
    device = lookup_gpu(headline)
    corr = correction(headline)
    timing = run.timing(device, req.gpus, lambda s: _corrected_speed(s, corr))
    speed, steps, time_hours = timing.speed, timing.steps, timing.hours
    # MFU as defined: model FLOPs over the GPUs' peak dense rate; the roofline's own figure is over the
    # measured matmul rate (a larger share of a smaller number), named for what it is
    mfu_peak = speed.mfu * device.matmul_tflops / device.dense_tflops if device.dense_tflops else speed.mfu
    cpu = headline == CPU.name
    if cpu:  # the runner on this machine's CPU: fp32, host RAM, no CUDA context
        mem = on_cpu(arch, req, req.gpus)
    mem_gb = _corrected_memory(mem, corr)
    breakdown = mem.breakdown_gb()
    if corr is not None and corr.memory_runs:
        breakdown["calibration"] = round(mem_gb - mem.per_gpu_gb, 3)

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
        f"{mfu_peak:.0%} of the {device.dense_tflops:g} TFLOPS bf16 dense peak ({speed.mfu:.0%} of the "
        f"{device.matmul_tflops:g} TFLOPS measured matmul rate; {req.stack} stack"
        + (", compiled" if req.compile else "")
        + ")"
        + ("" if headline_fits else f"; it does not fit {device.label} x{req.gpus}: a time if it did"),
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
    lo, hi = mem_ratio
    classes = ", ".join(memory_classes(req)) or "no special class"
    assumptions.append(
        f"ranges: memory x{lo:.2f}-{hi:.2f} ({classes}), speed x{speed_ratios[0]:.2f}-{speed_ratios[1]:.2f}: "
        "90% prediction intervals from the planner's errors on published sources it was not fitted on (leave "
        "one source out, per class of job); offers must fit the top"
    )
    if corr is not None:
        assumptions.append(corr.describe())
    if req.gpus > 1:
        assumptions.append(
            f"{req.gpus} GPUs with FSDP full sharding: weights, gradients and optimizer states split, "
            "activations and logits per GPU; the GPUs talk over "
            f"{device.link or 'their interconnect'}"
        )
    if req.gpus > 1 and req.optimizer != "adamw":
        assumptions.append(
            f"warning: {req.optimizer} (bitsandbytes) breaks checkpoint saves under FSDP: use adamw"
        )
    if mem.offloaded:
        assumptions.append(
            "kept off the GPU: " + ", ".join(f"{k} {v / GB:.1f} GB" for k, v in mem.offloaded.items())
        )
    if run.token_source == "default":
        assumptions.append(f"no dataset or tokens= given: assumed {DEFAULT_TOKENS:,} tokens")
    sugg = [] if n_fit else (budget_suggestions(offers, job, req, steps) or suggestions(arch, req, offers))
    plan = training_plan(arch, req, sharding=mem.sharding, dataset_format=inputs.dataset_format)
    if run.data is not None:  # the held-out examples as counted (the automatic split decided by the data)
        held = len(run.data.eval_lengths)
        plan = plan.model_copy(
            update={"eval_examples": held, "plateau_on": "eval loss" if held else "train loss"}
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
            per_gpu_gb=round(mem_gb, 3),
            breakdown_gb=breakdown,
            gpus=req.gpus,
            sharding=mem.sharding,
            per_gpu_gb_range=[round(v, 3) for v in memory_range(mem_gb, mem_ratio)],
        ),
        speed=SpeedEstimate(
            gpu=headline,
            gpus=req.gpus,
            tokens_per_second=round(speed.tokens_per_second, 2),
            step_seconds=round(speed.step_seconds, 4),
            mfu=round(mfu_peak, 4),
            matmul_share=round(speed.mfu, 4),
            fits=headline_fits,
            flops_per_token=speed.flops_per_token,
            tokens_per_second_range=[round(v, 2) for v in speed_range(speed.tokens_per_second, speed_ratios)],
            calibrated_runs=corr.speed_runs if corr else 0,
            calibration=corr.describe() if corr else None,
        ),
        time=TimeEstimate(
            tokens=timing.tokens_per_epoch,
            epochs=round(timing.epochs, 4),
            steps=steps,
            hours=round(time_hours, 4),
            token_source=run.token_source,
            hours_range=[round(v, 4) for v in hours_range(time_hours, speed_ratios)],
            steps_per_epoch=timing.steps_per_epoch,
            evaluations=timing.evaluations,
            eval_tokens=timing.eval_tokens,
            eval_hours=round(timing.eval_seconds / 3600.0, 6),
            samples=timing.samples,
            sample_tokens=timing.sample_tokens,
            sample_hours=round(timing.sample_seconds / 3600.0, 6),
            length=timing.describe,
        ),
        offers=ranked,
        assumptions=assumptions,
        suggestions=sugg,
        prices_as_of=prices_as_of,
        prices_source=prices_source,
        training=plan,
        warnings=risk_warnings(req),
        disk=DiskEstimate(gb=disk.gb, breakdown_gb=disk.breakdown()),
    )
