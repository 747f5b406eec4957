"""The whole run priced by the phases the runner reports (runner/contract/phases.py), so a quote and a run can
be set side by side phase by phase, and the quote is the whole billed run, not its steady steps alone.

The runner's side of a run on a (GPU, count), from sizes, rates and the step's roofline (``runner_phases``):

- load: the model's weights read from the host's disk and built (transformers' from_pretrained, peft's
  adapters, the CUDA context on a GPU), QLoRA's weights quantized on the GPU; the download is the offer's
  (its downlink: ``offer_phases``);
- data: the dataset read, templated and tokenized record by record (the contract's tokenizer path), fitted
  and split;
- base_eval and evals: forward passes over the eval split (bot/planner/length.py prices a pass);
- warmup: the first optimizer step, with what a run does once (the optimizer's states made, the allocator's
  pool, oneDNN's or cuBLAS's kernels picked for each shape);
- steps, optimizer, logging: every later step's micro-steps, its update and the runner's work between steps
  (bot/planner/speed.py: matmuls, attention, memory traffic and the host's dispatch of every op);
- samples: the side-by-side answers (length.py);
- output: the adapter or model written, hashed for its signed manifest and uploaded (a merge reads the base
  model and writes it merged).

And the offer's (``offer_phases``): start (the host's boot, the install on a stock image, the process's
imports, or a fork of a process that has them: the local provider's prewarm), the download, the timed
checkpoint saves (one every interval of the training loop, none in a shorter run), and on interruptible
capacity the work expected to be lost and redone.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.planner.architectures import Architecture
from bot.planner.gpus import GPU
from bot.planner.request import EstimateRequest
from runner.contract.phases import PHASES
from runner.contract.spec import WANDB_INIT_TIMEOUT_S

# Seconds from the runner process's start to its first phase: Python, the spec, and the training libraries'
# imports (torch, transformers, peft, accelerate, safetensors; bitsandbytes on a GPU host; runner/prewarm.py's
# PRELOAD). Measured on the development machine's 2 cores: 3.9 s (bench/quote_vs_run.py); a cloud host's
# image imports the same from its disk, with CUDA's libraries, in about 15 s. A runner forked from the local
# provider's prewarmed process (bot/providers/prewarm.py) has them: its start is the fork and the spec.
IMPORT_SECONDS = {"cpu": 3.9}
IMPORT_SECONDS_GPU = 15.0
FORK_SECONDS = 0.5
# W&B's start (runner/wandb_log.py, its own phase): `import wandb` and wandb.init offline took 1.07-1.13 s on
# a core of a machine whose Python ran at 0.70 of the development machine's (2026-12-07), so 0.77 s there.
# Online, init waits on W&B's server; the runner gives up after WANDB_INIT_TIMEOUT_S and logs offline:
# priced at that bound (no W&B server is reachable from here to measure a typical one).
WANDB_START_SECONDS = 0.77
WANDB_ONLINE_SECONDS = WANDB_INIT_TIMEOUT_S
# Building the model around its weights: from_pretrained's modules, peft's adapters, the loss's check, the
# optimizer (the CPU's tiny model: 0.1 s); on a GPU the CUDA context and the copy to the device too.
LOAD_FIXED_SECONDS = {"cpu": 0.1}
LOAD_FIXED_SECONDS_GPU = 5.0
DISK_READ_GBS = 1.0  # safetensors read from the host's disk (NVMe overlays, network volumes)
QUANTIZE_PARAMS_PER_SECOND = 2e9  # bitsandbytes' NF4 quantization on the GPU, per 4-bit parameter
# The dataset read, checked and templated a record at a time and tokenized (the runner's contract path:
# runner/contract/tokenize.py through the model's fast tokenizer): about 100 us a record and 1 us a token on
# the development machine's cores (400 alpaca records of 57 tokens: 0.05 s).
DATA_SECONDS_PER_RECORD = 1e-4
DATA_SECONDS_PER_TOKEN = 1e-6
# The first step's one-time work beyond a steady step: AdamW's states made, the allocator's first segments,
# oneDNN's primitives for each new shape (CPU: under 0.1 s for the tiny model), cuBLAS's handles and
# heuristics (GPU).
WARMUP_SECONDS = {"cpu": 0.1}
WARMUP_SECONDS_GPU = 2.0
# What a save or the output costs beyond its bytes: the tokenizer and config files, the model card, the
# manifest, fsspec's calls (CPU, a local folder: 0.02-0.1 s for the tiny model's adapter; a cloud host's
# object store: seconds a file).
SAVE_FIXED_SECONDS = {"cpu": 0.1}
SAVE_FIXED_SECONDS_GPU = 20.0
HASH_GBS = 1.0  # SHA-256 of every file for the signed manifest
UPLOAD_GBS = {"cpu": 2.0}  # a local folder: a copy
UPLOAD_GBS_GPU = 0.2  # a cloud host's upload to object storage


@dataclass(frozen=True)
class StepCosts:
    """What one optimizer step costs, by the phase its parts fall in (speed.SpeedResult's parts)."""

    micro_steps: float  # the step's micro-steps (forward and backward, with their dispatch)
    optimizer: float
    logging: float

    @property
    def seconds(self) -> float:
        return self.micro_steps + self.optimizer + self.logging


def _on(table: dict[str, float], gpu_value: float, device: GPU) -> float:
    return table.get(device.kind, gpu_value) if device.kind == "cpu" else gpu_value


def _host(device: GPU) -> float:
    """How much longer the host's own work takes on a CPU shared with other work, or slower than the
    development machine's (1 with a core of that machine to itself)."""
    return device.host_factor


def import_seconds(device: GPU, *, warm: bool = False) -> float:
    """The runner process's start: its imports, or a fork of a process that has them. On this machine's CPU,
    once a runner of the kind has started here, what its start took at a whole core (the local provider's
    readings: bot/providers/start_readings.py) over the share of a core a start now gets: an import is only
    partly Python, so the development machine's figure scaled by the Python speed over-quoted it (6.2 s
    quoted, 4.4-4.7 s taken at a Python speed of 0.63)."""
    measured = device.fork_seconds if warm else device.start_seconds
    if measured:
        return measured / max(device.host_share, 1e-3)
    if warm:
        return FORK_SECONDS * _host(device)
    return _on(IMPORT_SECONDS, IMPORT_SECONDS_GPU, device) * _host(device)


def wandb_seconds(mode: str, device: GPU) -> float:
    """W&B's start where the run logs to it: wandb imported, its service process and run started (host
    work, as the imports); online, the wait on W&B's server at the most the runner lets it take."""
    if mode == "disabled":
        return 0.0
    return WANDB_START_SECONDS * _host(device) + (WANDB_ONLINE_SECONDS if mode == "online" else 0.0)


def save_seconds(data_bytes: float, device: GPU) -> float:
    """One save (a checkpoint, the output): written, hashed, uploaded, with the fixed files around it."""
    upload = _on(UPLOAD_GBS, UPLOAD_GBS_GPU, device)
    gb = data_bytes / 1e9
    fixed = _on(SAVE_FIXED_SECONDS, SAVE_FIXED_SECONDS_GPU, device)
    return (fixed + gb / DISK_READ_GBS + gb / HASH_GBS + gb / upload) * _host(device)


def output_bytes(arch: Architecture, req: EstimateRequest, trainable: int) -> float:
    """The output's weights: the adapter (fp32, bf16 under autocast) or the whole model in 16 bits."""
    if req.method == "full":
        return 2.0 * arch.parameters
    return trainable * (2.0 if req.autocast else 4.0)


def runner_phases(
    arch: Architecture,
    req: EstimateRequest,
    device: GPU,
    *,
    steps: int,
    step: StepCosts,
    eval_pass_seconds: float,
    evaluations: int,
    sample_seconds: float,
    records: int,
    tokens: int,
    trainable: int,
) -> dict[str, float]:
    """The runner's side of the run on ``device``, seconds by phase (runner/contract/phases.py): what does
    not depend on the offer (its boot, download and checkpoint interval: ``offer_phases``)."""
    load = _on(LOAD_FIXED_SECONDS, LOAD_FIXED_SECONDS_GPU, device)
    load = (load + 2.0 * arch.parameters / 1e9 / DISK_READ_GBS) * _host(device)
    if req.method == "qlora" and device.kind != "cpu":
        load += arch.block_linear_params / QUANTIZE_PARAMS_PER_SECOND
    out = output_bytes(arch, req, trainable)
    output = save_seconds(out, device)
    if req.merge and req.method != "full":
        output += save_seconds(2.0 * arch.parameters, device) + 2.0 * arch.parameters / 1e9 / DISK_READ_GBS
    later = max(0, steps - 1)
    phases = dict.fromkeys(PHASES, 0.0)
    phases.update(
        load=load,
        data=(records * DATA_SECONDS_PER_RECORD + tokens * DATA_SECONDS_PER_TOKEN) * _host(device),
        wandb=wandb_seconds(req.wandb, device),
        base_eval=eval_pass_seconds if evaluations else 0.0,
        warmup=(step.seconds + _on(WARMUP_SECONDS, WARMUP_SECONDS_GPU, device) * _host(device))
        if steps
        else 0.0,
        steps=later * step.micro_steps,
        optimizer=later * step.optimizer,
        logging=later * step.logging,
        evals=eval_pass_seconds * max(0, evaluations - 1),
        samples=sample_seconds,
        output=output,
    )
    return phases


def loop_seconds(phases: dict[str, float]) -> float:
    """The training loop's time: what the runner's timed checkpoint interval runs on."""
    return sum(phases[k] for k in ("warmup", "steps", "optimizer", "logging", "evals"))


def offer_phases(
    runner: dict[str, float],
    *,
    start_s: float,
    download_s: float,
    saves: float,
    save_s: float,
    lost_s: float = 0.0,
) -> dict[str, float]:
    """A quote by phase on one offer: the runner's phases, the offer's start (boot, install, imports) and
    download, its timed checkpoint saves, and (``preemption``) the work an interruptible offer is expected
    to lose and redo."""
    out = dict(runner)
    out["start"] = out.get("start", 0.0) + start_s
    out["load"] = out.get("load", 0.0) + download_s
    out["checkpoints"] = out.get("checkpoints", 0.0) + saves * save_s
    if lost_s > 0:
        out["preemption"] = lost_s
    return {k: round(v, 3) for k, v in out.items()}
