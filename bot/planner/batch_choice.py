"""How a step is split on a card: micro-batch, gradient accumulation, activation checkpointing and the loss.

Pure. The person asks for an effective batch (rows of seq_len tokens per optimizer step and GPU: micro-batch
x accumulation, ``batch=`` x ``accum=``, default 1 x 1); the planner picks how to run it on each card: the
configuration with the shortest step (bot/planner/speed.py) among those whose memory range, at its top plus
the safety margin, fits the card (what ranking judges a fit by, bot/planner/rank.py). Everything the person
pinned stays as given: ``batch=`` fixes the micro-batch (and ``accum=`` with it), ``checkpointing=`` and
``loss=`` their own. So a small model on a big card trains at a micro-batch that fills it, without
checkpointing (about 41% more ops per step, a third more matmul passes) and with the plain loss (no chunk
recomputed in backward); a model that barely fits keeps checkpointing and the chunked loss. The card says what
was chosen and why (``BatchChoice.why``); the runner gets it in the training plan (bot/planner/training.py,
bot/engine/launching/jobspec.py) and, out of memory all the same, backs off and grows back (runner/oom.py).

On the CPU (the local provider) nothing is chosen: the request's own settings train there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from bot.planner.request import EstimateRequest


@dataclass(frozen=True)
class BatchChoice:
    micro_batch_size: int
    grad_accum: int
    gradient_checkpointing: bool
    loss: str  # "plain" | "chunked" (| "liger" when asked for)
    chosen: bool  # False: nothing left to choose (all pinned, or the CPU), or nothing fits this card
    why: str  # the card's line: what was chosen and why

    def apply(self, req: EstimateRequest) -> EstimateRequest:
        """``req`` with this choice's settings (fields the person set keep their value: they are the same)."""
        return req.model_copy(
            update={
                "batch_size": self.micro_batch_size,
                "grad_accum": self.grad_accum,
                "gradient_checkpointing": self.gradient_checkpointing,
                "loss": self.loss,
            }
        )


def rows_per_step(req: EstimateRequest) -> int:
    """The effective batch the person asked for: rows per optimizer step on each GPU."""
    return req.batch_size * req.grad_accum


def candidates(req: EstimateRequest) -> list[EstimateRequest]:
    """Every configuration of ``req``'s effective batch the person left open, largest micro-batch first."""
    given = req.model_fields_set
    rows = rows_per_step(req)
    if "batch_size" in given:
        splits = [(req.batch_size, req.grad_accum)]
    else:
        splits = [(m, rows // m) for m in range(rows, 0, -1) if rows % m == 0]
    checkpointing = [req.gradient_checkpointing] if "gradient_checkpointing" in given else [False, True]
    losses = [req.loss] if "loss" in given else ["plain", "chunked"]
    return [
        req.model_copy(update={"batch_size": m, "grad_accum": a, "gradient_checkpointing": c, "loss": loss})
        for m, a in splits
        for c in checkpointing
        for loss in losses
    ]


def choose(
    req: EstimateRequest,
    *,
    card: str,
    need_gb: Callable[[EstimateRequest], float],
    capacity_gb: float,
    step_seconds: Callable[[EstimateRequest], float],
) -> BatchChoice:
    """The fastest of ``candidates(req)`` whose ``need_gb`` (the top of its memory range with the safety
    margin) is within ``capacity_gb``; the request's own settings when nothing is open or nothing fits."""
    options = candidates(req)
    own = as_asked(req)
    if len(options) <= 1:
        return own
    fitting = [(step_seconds(r), need_gb(r), r) for r in options]
    fitting = [f for f in fitting if f[1] <= capacity_gb]
    if not fitting:
        return replace(own, why=f"nothing fits {card} at {rows_per_step(req)} rows per step")
    seconds, need, best = min(fitting, key=lambda f: (f[0], f[1]))
    return BatchChoice(
        micro_batch_size=best.batch_size,
        grad_accum=best.grad_accum,
        gradient_checkpointing=best.gradient_checkpointing,
        loss=best.loss,
        chosen=True,
        why=_why(req, best, card, need, capacity_gb, seconds, options, step_seconds, need_gb),
    )


def as_asked(req: EstimateRequest) -> BatchChoice:
    """The request's own configuration, nothing chosen (the CPU; everything pinned)."""
    return BatchChoice(
        req.batch_size, req.grad_accum, req.gradient_checkpointing, req.loss, False, "as asked"
    )


def _describe(r: EstimateRequest) -> str:
    ckpt = "checkpointing" if r.gradient_checkpointing else "no checkpointing"
    return f"micro-batch {r.batch_size} x accum {r.grad_accum}, {ckpt}, {r.loss} loss"


def _why(
    req: EstimateRequest,
    best: EstimateRequest,
    card: str,
    need: float,
    capacity: float,
    seconds: float,
    options: list[EstimateRequest],
    step_seconds: Callable[[EstimateRequest], float],
    need_gb: Callable[[EstimateRequest], float],
) -> str:
    """'fastest that fits h100-80gb (needs 21.3 of 80 GB): 1.9x the speed of micro-batch 1 x accum 8,
    checkpointing, chunked loss'. The slowest configuration is the safest one (the smallest micro-batch,
    checkpointing, the chunked loss): the comparison says what the choice buys."""
    safest = min(options, key=lambda r: (need_gb(r), -step_seconds(r)))
    text = f"fastest that fits {card} (needs {need:.1f} of {capacity:.0f} GB)"
    if safest is not best:
        text += f": {step_seconds(safest) / seconds:.2f}x the speed of {_describe(safest)}"
    pinned = pinned_options(req)
    if pinned:
        text += "; as given: " + ", ".join(pinned)
    return text


def pinned_options(req: EstimateRequest) -> list[str]:
    """The options the person set that a choice keeps (their option keys): ``batch`` (with ``accum``),
    ``checkpointing``, ``loss``. ``accum`` alone sets the effective batch, which is split as fits."""
    given = req.model_fields_set
    names = {"batch_size": "batch", "gradient_checkpointing": "checkpointing", "loss": "loss"}
    return [name for field, name in names.items() if field in given]
