"""How long a run is: one arithmetic for the runner (which trains it) and the planner (which prices it).

Pure Python, no torch: the bot imports it (with runner/data's packing and tokenizing) to count exactly what
the runner will do. The rules, also in docs/using.md ("How long a job runs") and docs/runner.md:

- an optimizer step is ``grad_accum`` micro-batches on every process;
- an epoch is one pass over the train split in the runner's own micro-batches (runner/contract/packing.py
  packs the tokenized examples into rows of ``seq_len`` and groups ``micro_batch_size`` rows): each process
  takes every world-th micro-batch, so an epoch has floor(micro-batches / processes / grad_accum) optimizer
  steps (the few micro-batches left over are not trained in that epoch; the next epoch's shuffle puts
  others last);
- ``steps`` (max_steps), when given, is the number of optimizer steps trained, whatever ``epochs`` says: the
  data repeats as often as needed (or is cut short). Without it, steps = ceil(epochs x steps per epoch);
- with an eval split the runner evaluates the base model once before the first step (the "before" of the
  result) and once at the end (the "after"); in between every ``plateau.every_steps`` steps only when
  something needs the curve (``eval_every``): the plateau stop (it watches the eval loss), the result kept
  as the best step (keep=best, one process), or a cadence someone set (PlateauSpec.every_steps, a sweep's
  stages). So 1 + ceil(steps / every) passes, or 2 when nothing needs them; each over the whole split on
  every process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from runner.contract.packing import Plan, epoch_rng, plan_packed, plan_unpacked
from runner.contract.spec import PlateauSpec


def steps_per_epoch(micro_batches: int, processes: int, grad_accum: int) -> int:
    """Optimizer steps in one epoch of ``micro_batches`` (all processes together)."""
    return (micro_batches // max(processes, 1)) // max(grad_accum, 1)


def total_steps(per_epoch: int, epochs: float, max_steps: int | None) -> int:
    """The optimizer steps a run trains: ``max_steps`` when given, else ceil(epochs x steps per epoch)."""
    if max_steps:
        return max_steps
    return max(1, math.ceil(epochs * per_epoch))


def evaluations(steps: int, every: int) -> int:
    """Eval passes in a run of ``steps``: at every multiple of ``every`` and at the end."""
    return -(-steps // max(every, 1))


def eval_every(plateau: PlateauSpec, steps: int, *, keep: str | None, processes: int) -> int | None:
    """How often a run with an eval split evaluates between the base model's pass and the final one: every
    ``plateau.every_steps`` (resolved for ``steps``) when the plateau stop watches the eval loss, the result
    is the best step (keep best, the default with an eval split, on one process) or the cadence was set;
    None when nothing needs the curve (the eval passes are priced, so none is made for nothing)."""
    keep_best = (keep or "best") == "best" and processes <= 1
    if plateau.enabled or keep_best or plateau.every_steps is not None:
        return plateau.resolved(steps).every_steps or 1
    return None


def plan_batches(
    lengths: Sequence[int], *, seq_len: int, micro_batch_size: int, packing: bool, seed: int, epoch: int
) -> Plan:
    """The runner's micro-batches of one epoch (example indices per row), as ``make_batches`` plans them."""
    capped = [min(n, seq_len) for n in lengths]
    rng = epoch_rng(seed, epoch)
    if packing:
        return plan_packed(capped, seq_len=seq_len, micro_batch_size=micro_batch_size, rng=rng)
    return plan_unpacked(capped, micro_batch_size=micro_batch_size, rng=rng)


@dataclass(frozen=True)
class Tokens:
    real: int = 0  # non-pad tokens (what the runner counts as trained)
    padded: int = 0  # rows x width of each micro-batch: what the GPU computes
    micro_batches: int = 0
    rows: int = 0

    @property
    def width(self) -> int:
        """The mean width of a row as computed (packed rows fill up to seq_len; unpacked ones are padded to
        the longest of their micro-batch)."""
        return max(1, round(self.padded / self.rows)) if self.rows else 0


def count(plan: Plan, lengths: Sequence[int], seq_len: int, indices: Sequence[int] | None = None) -> Tokens:
    """Tokens of the micro-batches ``indices`` of ``plan`` (all of them by default)."""
    real = padded = rows = 0
    chosen = range(len(plan)) if indices is None else indices
    for i in chosen:
        sizes = [sum(min(lengths[e], seq_len) for e in row) for row in plan[i]]
        real += sum(sizes)
        padded += max(sizes) * len(sizes)
        rows += len(sizes)
    return Tokens(real, padded, len(chosen), rows)


def trained_indices(micro_batches: int, processes: int, grad_accum: int) -> list[int]:
    """The micro-batches an epoch trains: each process's first steps_per_epoch x grad_accum of its share."""
    used = steps_per_epoch(micro_batches, processes, grad_accum) * grad_accum
    return sorted(i for rank in range(processes) for i in range(rank, micro_batches, processes)[:used])


@dataclass(frozen=True)
class RunLength:
    """What a run will do, in the runner's own units; the runner prints it before training."""

    steps: int  # optimizer steps trained
    steps_per_epoch: int
    epochs: float  # steps / steps_per_epoch: above 1 the data repeats
    max_steps_given: bool  # steps= decided the length (epochs not used)
    processes: int
    tokens_per_step: int  # seq_len x micro-batch x grad_accum x processes (the most a step can hold)
    epoch: Tokens  # the micro-batches one epoch trains (epoch 0's shuffle)
    eval_every: int | None = None  # None: no eval split
    evaluations: int = 0  # eval passes, the base model's before the first step included
    eval_pass: Tokens = Tokens()  # one eval pass on one process (every process computes the whole split)

    @property
    def tokens(self) -> int:
        """Non-pad tokens the whole run trains (epoch 0's count per epoch)."""
        return round(self.epoch.real * self.epochs)

    @property
    def fill(self) -> float:
        """Real tokens per computed token (padding of the rows and of the micro-batches)."""
        return self.epoch.real / self.epoch.padded if self.epoch.padded else 1.0

    def describe(self) -> str:
        """'400 steps (steps=400: 22.2 passes over the data, 18 steps each) ...', printed first by the runner
        and shown by the estimate."""
        if self.max_steps_given:
            what = f"{self.steps:,} steps (steps={self.steps}: {self.epochs:.3g} passes over the data"
        else:
            what = f"{self.steps:,} steps ({self.epochs:g} epoch(s)"
        line = (
            f"{what}, {self.steps_per_epoch:,} steps each); up to {self.tokens_per_step:,} tokens per "
            f"step, {self.epoch.real:,} tokens per epoch in {self.epoch.micro_batches:,} micro-batches"
        )
        if self.eval_every and self.eval_every < self.steps:
            line += (
                f"; eval before training, every {self.eval_every} steps and at the end: {self.evaluations} "
                f"passes of {self.eval_pass.real:,} tokens"
            )
        elif self.eval_every:
            line += (
                f"; eval before training and at the end: {self.evaluations} passes of "
                f"{self.eval_pass.real:,} tokens"
            )
        return line


def run_length(
    train_lengths: Sequence[int],
    eval_lengths: Sequence[int],
    *,
    seq_len: int,
    micro_batch_size: int,
    grad_accum: int,
    processes: int,
    packing: bool,
    seed: int,
    epochs: float,
    max_steps: int | None,
    plateau: PlateauSpec | None = None,
    plans: tuple[Plan, Plan] | None = None,
    keep: str | None = None,
) -> RunLength:
    """The length of a run over examples of these token lengths (after truncation / dropping). ``plans``: the
    train and eval batch plans already made for these lengths and settings (they do not depend on the number
    of processes, so the planner makes them once for every GPU count it prices). ``keep``: the result asked
    for (JobSpec.keep; None: best with an eval split), which decides whether evals run between the first and
    the last (``eval_every``)."""
    plan = (
        plans[0]
        if plans
        else plan_batches(
            train_lengths,
            seq_len=seq_len,
            packing=packing,
            seed=seed,
            micro_batch_size=micro_batch_size,
            epoch=0,
        )
    )
    per_epoch = steps_per_epoch(len(plan), processes, grad_accum)
    steps = total_steps(per_epoch, epochs, max_steps)
    trained = count(plan, train_lengths, seq_len, trained_indices(len(plan), processes, grad_accum))
    every = evals = 0
    eval_pass = Tokens()
    if eval_lengths:
        cadence = eval_every(plateau or PlateauSpec(), steps, keep=keep, processes=processes)
        every = cadence or steps  # none between: the base model's pass and the one at the end
        evals = 1 + evaluations(steps, every)  # the base model's pass before the first step
        eval_plan = (
            plans[1]
            if plans
            else plan_batches(
                eval_lengths,
                seq_len=seq_len,
                micro_batch_size=micro_batch_size,
                packing=packing,
                seed=seed,
                epoch=0,
            )
        )
        eval_pass = count(eval_plan, eval_lengths, seq_len)
    return RunLength(
        steps=steps,
        steps_per_epoch=per_epoch,
        epochs=steps / per_epoch if per_epoch else 0.0,
        max_steps_given=bool(max_steps),
        processes=processes,
        tokens_per_step=seq_len * micro_batch_size * grad_accum * processes,
        epoch=trained,
        eval_every=every or None,
        evaluations=evals,
        eval_pass=eval_pass,
    )
