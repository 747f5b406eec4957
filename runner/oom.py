"""Out of GPU memory is a setting to change, not a job to lose.

When a step runs out of memory the runner discards that step's partial gradients and runs the same step again
with each micro-batch split in two (half the rows, twice the accumulation: the same effective batch, the same
summed loss over the same label tokens, so the same gradient and loss curve), down to one row per micro-step;
then with activation checkpointing turned on if it was off; past that it exits with EXIT_OUT_OF_MEMORY and the
bot relaunches the job on an offer with more memory per GPU (bot/engine/watching/grow.py). The data position,
the checkpoints and the loss normalisation never see the split: they count the spec's micro-batches.

A back-off is not for the rest of the run: an out-of-memory error can be one long batch or a fragmented cache,
and the planner chose the spec's level as the fastest that fits (bot/planner/batch_choice.py). After
``GrowBack.after`` good steps at a lower level the runner tries the level above again; when that runs out of
memory again it backs off once more and waits twice as long before the next try.

One process backs off in place. Several processes cannot (a rank that failed leaves the others waiting in a
collective): the rank exits with EXIT_OUT_OF_MEMORY and the launcher (runner/distributed.py) starts all ranks
again one level further (LEVEL_ENV), from the newest checkpoint.

Tests inject the error on the CPU with TEST_OOM_ENV="N" (a micro-step of more than N tokens raises
torch.OutOfMemoryError) or "N:M" (the limit is M once activation checkpointing is on), at most
TEST_OOM_TIMES_ENV times when that is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: the multi-process launcher reads levels() without it
    import torch

LEVEL_ENV = "TUNEBOT_OOM_LEVEL"  # set by the launcher for the workers of a restarted multi-process run
TEST_OOM_ENV = "TUNEBOT_TEST_OOM"
TEST_OOM_TIMES_ENV = "TUNEBOT_TEST_OOM_TIMES"
GROW_BACK_ENV = "TUNEBOT_OOM_GROW_BACK"  # good steps before growing back (tests shorten it)


class OutOfMemory(Exception):
    """Out of memory at one row per micro-step with activation checkpointing on: it needs a bigger GPU."""


@dataclass(frozen=True)
class Level:
    """How the spec's micro-batches run: split into `parts` micro-steps each, with or without checkpoints."""

    parts: int = 1
    checkpointing: bool = False

    def describe(self, micro_batch_size: int, grad_accum: int) -> str:
        rows = max(1, micro_batch_size // self.parts)
        text = f"micro-batch {rows} x grad_accum {grad_accum * self.parts}"
        return text + (", activation checkpointing on" if self.checkpointing else "")


def levels(micro_batch_size: int, checkpointing: bool) -> list[Level]:
    """Every level the runner may try, in order: halve the micro-batch down to 1, then checkpointing."""
    out, parts = [], 1
    while True:
        out.append(Level(parts, checkpointing))
        if parts * 2 > micro_batch_size:
            break
        parts *= 2
    if not checkpointing:
        out.append(Level(parts, True))
    return out


GROW_BACK_STEPS = 50  # good steps at a backed-off level before the level above is tried again


@dataclass
class GrowBack:
    """When to try the level above again after a back-off (one process only: several restart together)."""

    after: int = field(default_factory=lambda: int(os.environ.get(GROW_BACK_ENV) or GROW_BACK_STEPS))
    good_steps: int = 0  # steps that ran at the current level since the last change
    tried: bool = False  # the current level was reached by growing back: an OOM now doubles ``after``

    def backed_off(self) -> None:
        if self.tried:
            self.after *= 2
        self.good_steps, self.tried = 0, False

    def step_ok(self, level: int, lowest: int) -> bool:
        """Count a good step at ``level``; True when it is time to grow one level back (towards ``lowest``,
        the level the run started at)."""
        if level <= lowest:
            return False
        self.good_steps += 1
        if self.good_steps < self.after:
            return False
        self.good_steps, self.tried = 0, True
        return True


def start_level(micro_batch_size: int, checkpointing: bool) -> int:
    """The index into levels() to start at (0, or the launcher's LEVEL_ENV after an out of memory)."""
    index = int(os.environ.get(LEVEL_ENV, "0") or 0)
    return max(0, min(index, len(levels(micro_batch_size, checkpointing)) - 1))


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or a CUDA library's out of memory (cuBLAS, cuDNN raise RuntimeError)."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    signs = ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
    return isinstance(exc, RuntimeError) and any(sign in text for sign in signs)


def split_rows(batch: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    """`batch` cut into at most `parts` batches of consecutive rows (every tensor's first axis)."""
    import torch

    rows = next(iter(batch.values())).shape[0]
    pieces = min(parts, rows)
    if pieces <= 1:
        return [batch]
    cut = {k: torch.tensor_split(v, pieces) for k, v in batch.items()}
    return [{k: cut[k][i] for k in batch} for i in range(pieces)]


def release(device: Any) -> None:
    """Hand what the failed step cached back, so the retry starts from the steady state."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


_injected = [0]  # errors injected in this process (TEST_OOM_TIMES_ENV bounds them)


def maybe_inject(tokens: int, checkpointing: bool) -> None:
    """The test hook: raise torch.OutOfMemoryError for a micro-step above the configured size (at most
    TEST_OOM_TIMES_ENV times in this process when that is set: a passing shortage)."""
    spec = os.environ.get(TEST_OOM_ENV)
    if not spec:
        return
    plain, _, with_ckpt = spec.partition(":")
    limit = int(with_ckpt) if (checkpointing and with_ckpt) else int(plain)
    times = os.environ.get(TEST_OOM_TIMES_ENV)
    if tokens > limit and (not times or _injected[0] < int(times)):
        import torch

        _injected[0] += 1
        raise torch.OutOfMemoryError(f"injected: {tokens} tokens in a micro-step (limit {limit})")


def next_level(spec_json: str, level: int) -> tuple[int | None, str, str]:
    """For the launcher, after a rank ran out of memory at `level`: (the next level or None, where it failed,
    what comes next)."""
    import json

    spec = json.loads(spec_json)
    mb, ga = int(spec.get("micro_batch_size", 1)), int(spec.get("grad_accum", 1))
    all_levels = levels(mb, bool(spec.get("gradient_checkpointing", True)))
    where = all_levels[level].describe(mb, ga)
    if level + 1 >= len(all_levels):
        return None, where, ""
    return level + 1, where, all_levels[level + 1].describe(mb, ga)


def report(spec_json: str, kind: str, message: str) -> None:
    """An event from the launcher (rank 0 may have been stopped before it could say it), after the newest
    one the progress object knows."""
    from runner.contract.spec import EventKind, JobSpec
    from runner.report import Reporter, next_seq_in_progress

    spec = JobSpec.model_validate_json(spec_json)
    reporter = Reporter(spec, start_seq=next_seq_in_progress(spec))
    try:
        reporter.emit(EventKind(kind), message=message[:2000])
    finally:
        reporter.close()
