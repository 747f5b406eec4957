"""Where a run's time goes, by phase: the names the runner reports and the planner quotes, written once.

The runner (runner/measure.py ``PhaseClock``) puts every second of a run in exactly one phase, from the
instance's start to its last report, so the phases add up to the billed wall clock; the planner
(bot/planner/phases.py) prices a run by the same phases, so `status JOB` and the finished card set quote
against run, phase by phase. What a host reports is a claim: ``bounded`` keeps the known names with finite
values within MAX_PHASE_SECONDS (the bot refuses nothing else in an event for it, and reads nothing more into
it: phases decide no money; the ledger bills from the provider's clock).
"""

from __future__ import annotations

import math
from typing import Any

# In the order a run goes through them (the cards list them so).
PHASES: tuple[str, ...] = (
    "start",  # the host's boot, the install on a stock image, the process and its imports
    "load",  # the model's download, load, quantization and adapters; a resumed checkpoint read
    "data",  # the dataset read, checked, tokenized, fitted and split; the length planned
    "wandb",  # W&B's start where the run logs to it: wandb imported, its service process and run started
    "base_eval",  # the base model's eval loss before the first step
    "warmup",  # the first optimizer step of a run (lazy initialization, allocator and kernel warm-up)
    "steps",  # every later step's forward and backward, its batch built and moved to the device
    "optimizer",  # gradient clipping, the optimizer and scheduler steps, zero_grad
    "logging",  # between steps: the chart's points, W&B, the printed line and the reports, the cap check
    "evals",  # eval passes while training and the last one
    "samples",  # the side-by-side answers of the base and the tuned model
    "checkpoints",  # checkpoint saves: written, signed, uploaded, old ones pruned
    "output",  # the output: saved, merged when asked, signed and uploaded
)

# What the cards call them.
LABELS: dict[str, str] = {
    "start": "start-up",
    "load": "model load",
    "data": "data",
    "wandb": "W&B start",
    "base_eval": "base model eval",
    "warmup": "first step",
    "steps": "steps",
    "optimizer": "optimizer",
    "logging": "logging, reports",
    "evals": "evals",
    "samples": "samples",
    "checkpoints": "checkpoints",
    "output": "output",
}

# The training phases: a steady speed (tokens/s) is measured over the last three, what calibration learns.
TRAINING = ("warmup", "steps", "optimizer", "logging")
STEADY = ("steps", "optimizer", "logging")

MAX_PHASE_SECONDS = 1e8  # about three years: anything more is not a phase of a run


def bounded(phases: Any) -> dict[str, float] | None:
    """A host's phases as the bot keeps them: the known names, in PHASES order, each a finite number of
    seconds in [0, MAX_PHASE_SECONDS] rounded to the millisecond; None when nothing is left."""
    if not isinstance(phases, dict):
        return None
    out: dict[str, float] = {}
    for name in PHASES:
        value = phases.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        value = float(value)
        if math.isfinite(value) and 0.0 <= value <= MAX_PHASE_SECONDS:
            out[name] = round(value, 3)
    return out or None


def total(phases: dict[str, float] | None) -> float:
    """The seconds the phases account for."""
    return float(sum((phases or {}).values()))
