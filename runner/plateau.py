"""Stopping a run whose loss has stopped improving, so nobody pays for idle training.

How the detector decides (``update(step, loss)`` returns True = stop now):

- The loss is smoothed with an exponential moving average, ``ema_t = a * ema_{t-1} + (1 - a) * loss_t``
  (``a`` = ``PlateauSpec.ema``), started from the first finite loss. Improvement is ABSOLUTE on the
  smoothed loss: ``best - ema > min_delta``, where ``best`` is the smoothed loss at the last improvement.
- The baseline (``best``) is taken at the first update at or after ``warmup_steps``; after that the
  detector evaluates every ``every_steps`` steps. ``patience`` evaluations in a row without improvement
  stop the run (and every later call answers True too).
- Smoothing lags: on a loss falling steadily by more than ``min_delta`` a step, the average needs about
  ``1 / (1 - a)`` steps to fall by ``min_delta``. So that lag alone can never look like a plateau, the
  patience actually used is at least ``ceil(1 / ((1 - a) * every_steps))`` evaluations
  (``effective_patience``); with the defaults (a=0.95, every 20 steps on a 1000-step run) that is 1.
- The defaults (``runner.contract.spec.Defaults``: patience 10, min_delta 0.01, ema 0.95, a look every max(10,
  max_steps/50) steps after the first 10%; ``PlateauSpec.resolved``) let a normal noisy curve run to its end
  and stop one that went flat for a fifth of the run; tests/runner/test_plateau.py has the curve from issue 10
  that the old defaults (patience 5, ema 0.9, every 10 steps, no warmup) stopped at step 161 of 1000.
- NaN or infinite losses never enter the average (one bad batch must not poison it) and an evaluation
  whose latest loss is not finite counts as "no improvement": a diverged run stops after ``patience``
  evaluations instead of burning money.
- The same detector works on an eval loss: call ``update`` only when an eval loss is computed; the
  schedule counts steps from the baseline, so calls every ``every_steps`` steps evaluate each time.

All counters are in ``state_dict()`` (plain JSON types), so a resumed run makes the same decisions as an
uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

from runner.contract.spec import PlateauSpec

_STATE_VERSION = 1


class PlateauDetector:
    def __init__(self, spec: PlateauSpec) -> None:
        if spec.every_steps is None or spec.warmup_steps is None:  # not resolved for a run length
            spec = spec.model_copy(
                update={"every_steps": spec.every_steps or 10, "warmup_steps": spec.warmup_steps or 0}
            )
        self.spec = spec
        self.every_steps: int = spec.every_steps  # type: ignore[assignment]
        self.warmup_steps: int = spec.warmup_steps  # type: ignore[assignment]
        horizon = 1.0 / ((1.0 - spec.ema) * self.every_steps)
        self.effective_patience = max(spec.patience, math.ceil(horizon - 1e-9))
        self.smoothed: float | None = None  # the EMA of the finite losses seen so far
        self.best: float | None = None  # smoothed loss at the last improvement (or the baseline)
        self.bad_evaluations = 0  # evaluations in a row without improvement
        self.evaluations = 0
        self.nonfinite = 0  # NaN/inf losses seen
        self.next_evaluation: int | None = None  # step of the next evaluation, once the baseline is set
        self.stopped = False
        self.last_step: int | None = None

    def decides_at(self, step: int) -> bool:
        """Whether ``update(step, ...)`` may decide anything (the baseline or an evaluation): the runner feeds
        the training losses it has not read back yet (runner/readback.py) at these steps and at reports only;
        fed in order, they make the same decisions as one call per step."""
        if not self.spec.enabled or self.stopped:
            return self.stopped
        if step < self.warmup_steps:
            return False
        return self.next_evaluation is None or step >= self.next_evaluation

    def update(self, step: int, loss: float) -> bool:
        """Feed the loss of ``step``; True means stop now (the loss has plateaued)."""
        if not self.spec.enabled:
            return False
        if self.stopped:
            return True
        self.last_step = step
        finite = math.isfinite(loss)
        if finite:
            # written as a step towards the loss so that a constant loss keeps the average exactly constant
            previous = self.smoothed
            self.smoothed = loss if previous is None else previous + (1 - self.spec.ema) * (loss - previous)
        else:
            self.nonfinite += 1
        if step < self.warmup_steps:
            return False
        if self.next_evaluation is None:  # the baseline; None if no finite loss was seen yet
            self.best = self.smoothed
            self.next_evaluation = step + self.every_steps
            return False
        if step < self.next_evaluation:
            return False
        self.next_evaluation = step + self.every_steps
        self.evaluations += 1
        if (
            finite
            and self.smoothed is not None
            and (self.best is None or self.best - self.smoothed > self.spec.min_delta)
        ):
            self.best = self.smoothed
            self.bad_evaluations = 0
        else:
            self.bad_evaluations += 1
        self.stopped = self.bad_evaluations >= self.effective_patience
        return self.stopped

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, as JSON-safe values."""
        return {
            "version": _STATE_VERSION,
            "smoothed": self.smoothed,
            "best": self.best,
            "bad_evaluations": self.bad_evaluations,
            "evaluations": self.evaluations,
            "nonfinite": self.nonfinite,
            "next_evaluation": self.next_evaluation,
            "stopped": self.stopped,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unknown plateau detector state version {state.get('version')!r}")
        self.smoothed = _optional_float(state["smoothed"])
        self.best = _optional_float(state["best"])
        self.bad_evaluations = int(state["bad_evaluations"])
        self.evaluations = int(state["evaluations"])
        self.nonfinite = int(state["nonfinite"])
        self.next_evaluation = None if state["next_evaluation"] is None else int(state["next_evaluation"])
        self.stopped = bool(state["stopped"])
        self.last_step = None if state["last_step"] is None else int(state["last_step"])


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
