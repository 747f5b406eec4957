"""How long the run takes on a GPU: its steps and eval passes (runner/contract/steps.py's rules) times the
roofline's time for micro-batches as wide as the runner will really make them.

With a dataset and the model's tokenizer (bot/planner/data_plan.py) the steps, tokens and eval passes are
exactly the runner's, and a micro-step is priced at the mean width of its rows (packed rows fill up to
seq_len, unpacked ones pad to the longest of their micro-batch). With ``tokens=`` (or the character
approximation) every row is assumed full. Eval passes are forward-only over the whole eval split on every
GPU: the forward share of a training micro-step's FLOPs; the base model's pass before the first step is one
of them (runner/contract/steps.py). The side-by-side answers (runner/samples.py) are priced as what the runner
does: for each of two models and each prompt, one forward over the prompt, then one forward of one token per
new token (greedy, with the KV cache: each of those reads the weights once).

The run's time is priced by the phases the runner reports (bot/planner/phases.py): ``Timing.phases`` are the
runner's side on a (GPU, count) - load, data, the base model's eval, the first step, the steady steps, the
optimizer, logging, evals, samples, the output - and ``hours`` their sum; each offer adds its start-up,
download and checkpoint saves (bot/planner/rank.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bot.planner.architectures import Architecture
from bot.planner.errors import BadRequestError
from bot.planner.gpus import GPU
from bot.planner.memory import trainable_parameters
from bot.planner.phases import StepCosts, loop_seconds, runner_phases
from bot.planner.request import EstimateRequest
from bot.planner.resolved import DataPlan
from bot.planner.speed import SpeedResult, estimate_speed, flops_per_token
from runner.contract.spec import Defaults


@dataclass(frozen=True)
class Timing:
    steps: int
    steps_per_epoch: int | None  # None without a dataset (tokens= or the approximation)
    epochs: float  # steps / steps per epoch: what the run really covers
    tokens_per_epoch: int
    evaluations: int
    eval_tokens: int  # one eval pass
    train_seconds: float
    eval_seconds: float
    speed: SpeedResult  # of a training micro-step as wide as the runner's rows
    describe: str  # the runner's own "length:" line (or the rule applied to tokens=)
    samples: int = 0  # prompts both models answer
    sample_tokens: int = 0  # new tokens each answer may have (greedy, stops at EOS)
    sample_seconds: float = 0.0
    # The runner's side of the run by phase (bot/planner/phases.py), seconds; empty: train, evals, samples.
    phases: dict[str, float] | None = None

    @property
    def hours(self) -> float:
        """The runner's work on this (GPU, count): every phase but the offer's start, download and saves."""
        if self.phases:
            return sum(self.phases.values()) / 3600.0
        return (self.train_seconds + self.eval_seconds + self.sample_seconds) / 3600.0

    @property
    def loop_hours(self) -> float:
        """The training loop's hours (its steps and evals): what the runner's timed saves run on."""
        return loop_seconds(self.phases) / 3600.0 if self.phases else self.hours


def forward_share(arch: Architecture, req: EstimateRequest) -> float:
    """A forward pass's share of a training micro-step's FLOPs (eval runs forward only, no recompute)."""
    attention = (2.0 if req.attn != "eager" else 4.0) * req.seq_len * arch.q_dim * arch.layers
    fwd = 2.0 * arch.matmul_parameters + attention
    return min(1.0, fwd / flops_per_token(arch, req))


def _step_costs(speed: SpeedResult) -> StepCosts:
    """A step's seconds split as the runner's phases see them: its micro-steps, the optimizer's update and the
    work between steps, in the shares the roofline gives them (a calibration scales the whole step)."""
    parts = speed.parts or {}
    whole = parts.get("step") or speed.step_seconds
    scale = speed.step_seconds / whole if whole > 0 else 1.0
    optimizer = parts.get("optimizer (per step)", 0.0) * scale
    logging = parts.get("logging (per step)", 0.0) * scale
    return StepCosts(max(0.0, speed.step_seconds - optimizer - logging), optimizer, logging)


class RunTime:
    """The steps and time of one request on any (GPU, count): the data is counted once, lengths per count."""

    def __init__(
        self,
        arch: Architecture,
        req: EstimateRequest,
        *,
        tokens: int,
        token_source: str,
        data: DataPlan | None,
    ) -> None:
        self.arch, self.req, self.tokens, self.token_source, self.data = arch, req, tokens, token_source, data
        self._lengths: dict[int, Any] = {}
        # This machine's CPU as a run of this request gets it (plan.cpu_share: its cores, what else runs
        # there); None: the CPU's defaults.
        self.cpu: GPU | None = None
        self.cpu_start: GPU | None = None  # the CPU as the run's start-up gets it (plan.cpu_share)

    def length(self, gpus: int) -> Any:
        """runner.contract.steps.RunLength on ``gpus`` processes (None without a counted dataset)."""
        if self.data is None:
            return None
        if gpus not in self._lengths:
            self._lengths[gpus] = self.data.length(self.req, gpus)
        return self._lengths[gpus]

    def check(self, gpus: int) -> None:
        """The runner's refusal, before anything is rented: a dataset too small for one optimizer step."""
        length = self.length(gpus)
        if length is not None and length.steps_per_epoch == 0:
            raise BadRequestError(
                f"the dataset makes {length.epoch.micro_batches} micro-batches, fewer than grad_accum x GPUs "
                f"({self.req.grad_accum} x {gpus}): not one optimizer step; add data or lower grad_accum"
            )

    def timing(
        self, device: GPU, gpus: int, correct: Callable[[SpeedResult], SpeedResult] = lambda s: s
    ) -> Timing:
        req, arch = self.req, self.arch
        if device.kind == "cpu" and self.cpu is not None:
            device = self.cpu
        length = self.length(gpus)
        if length is not None:
            steps, per_epoch, epochs = length.steps, length.steps_per_epoch, length.epochs
            width, tokens, describe = length.epoch.width or req.seq_len, length.epoch.real, length.describe()
        else:
            per_step = req.batch_size * req.seq_len * req.grad_accum * gpus
            from runner.contract.steps import total_steps

            steps = total_steps(max(1, math.ceil(self.tokens / per_step)), req.epochs, req.max_steps)
            per_epoch = None
            epochs = steps * per_step / self.tokens if req.max_steps else req.epochs
            width, tokens = req.seq_len, self.tokens
            rule = f"steps={req.max_steps}" if req.max_steps else f"{req.epochs:g} epoch(s)"
            describe = f"{steps:,} steps ({rule}) of {per_step:,} tokens, every row full"
        wide = req if width == req.seq_len else req.model_copy(update={"seq_len": width})
        speed = correct(estimate_speed(arch, wide, device, gpus))
        if length is not None and speed.step_seconds > 0:
            # what the runner reports: real (non-pad) tokens per second
            real = length.epoch.real / max(length.epoch.padded, 1)
            speed = replace(speed, tokens_per_second=speed.tokens_per_second * real)
        evals, eval_tokens, eval_seconds, eval_pass = 0, 0, 0.0, 0.0
        if length is not None and length.evaluations:
            evals, eval_tokens = length.evaluations, length.eval_pass.real
            ereq = req.model_copy(
                update={"seq_len": length.eval_pass.width, "gradient_checkpointing": False, "grad_accum": 1}
            )
            micro = correct(estimate_speed(arch, ereq, device, gpus)).micro_step_seconds
            eval_pass = length.eval_pass.micro_batches * micro * forward_share(arch, ereq)
            eval_seconds = evals * eval_pass
        samples = self.samples(length)
        sample_seconds = 0.0
        if samples:
            prompt = min(Defaults.sample_prompt_tokens, length.eval_pass.width if length is not None else 0)
            prompt = prompt or Defaults.sample_prompt_tokens // 2

            def forward(width: int) -> float:
                one = req.model_copy(
                    update={
                        "seq_len": width,
                        "batch_size": 1,
                        "gradient_checkpointing": False,
                        "grad_accum": 1,
                    }
                )
                micro = correct(estimate_speed(arch, one, device, gpus)).micro_step_seconds
                return micro * forward_share(arch, one)

            sample_seconds = 2 * samples * (forward(max(1, prompt)) + req.sample_tokens * forward(1))
        step = _step_costs(speed)
        data = self.data
        phases = runner_phases(
            arch,
            req,
            device,
            steps=steps,
            step=step,
            eval_pass_seconds=eval_pass,
            evaluations=evals,
            sample_seconds=sample_seconds,
            records=data.records if data is not None else max(1, self.tokens // max(1, req.seq_len // 4)),
            tokens=(sum(data.train_lengths) + sum(data.eval_lengths)) if data is not None else self.tokens,
            trainable=trainable_parameters(arch, req),
        )
        return Timing(
            steps=steps,
            steps_per_epoch=per_epoch,
            epochs=epochs,
            tokens_per_epoch=tokens,
            evaluations=evals,
            eval_tokens=eval_tokens,
            train_seconds=steps * speed.step_seconds,
            eval_seconds=eval_seconds,
            speed=speed,
            describe=describe,
            samples=samples,
            sample_tokens=req.sample_tokens if samples else 0,
            sample_seconds=sample_seconds,
            phases=phases,
        )

    def samples(self, length: Any) -> int:
        """The prompts both models will answer: the prompts file's, else held-out examples' (none without an
        eval split), at most ``samples=``."""
        req = self.req
        if not req.samples:
            return 0
        if req.prompts:
            return req.samples
        if length is None or not length.evaluations or self.data is None:
            return 0
        return min(req.samples, len(self.data.eval_lengths))
