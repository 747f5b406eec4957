"""A sweep's stage boundary: where a run pauses, and the bot's word that lets it go on.

A sweep (bot/engine/control/sweeps.py) trains its runs by successive halving: at each stage's last step the
better half goes on and the others stop. A run learns of its boundaries from its spec (``JobSpec.stages``):
there it evaluates, saves a checkpoint, reports both and waits (runner/stage.py) instead of training on, so a
run the sweep stops never trains past its stage and costs what the quote said. The sweep lets a run it keeps
go on with a ``decision`` object in the run's own checkpoint folder (``decision_uri``), signed with the run's
key (runner/contract/integrity.py, purpose ``stage``): "go on past step N, with this cap". A run it stops is
stopped as any job is (SIGTERM: the run leaves with the checkpoint it saved at the boundary).

Pure but for reading the object: the bot writes what ``decision`` makes, the runner reads it with
``released``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runner.contract.integrity import read_signed, sign

STAGE = "stage"  # the MAC's purpose: a decision can never pass for an event, a manifest or credentials
STAGE_FILE = "stage.json"
MAX_DECISION_BYTES = 4096


def decision_uri(checkpoint_uri: str) -> str:
    """Where a run finds the sweep's decision: ``<its checkpoint folder>/stage.json``."""
    return f"{checkpoint_uri.rstrip('/')}/{STAGE_FILE}"


@dataclass(frozen=True)
class Released:
    """The sweep keeps the run: it goes on past step ``through``, its own spend cap now ``max_cost``."""

    through: int
    max_cost: float | None = None


def decision(
    key: bytes | None, job_id: str, run_id: str | None, *, through: int, max_cost: float | None
) -> bytes:
    """The object that releases a run past step ``through`` (signed with the run's key)."""
    body: dict[str, Any] = {
        "version": 1,
        "job_id": job_id,
        "run_id": run_id,
        "through": int(through),
        "max_cost": max_cost,
    }
    return json.dumps(sign(key, STAGE, body), separators=(",", ":")).encode()


def released(raw: bytes, key: bytes | None, job_id: str, run_id: str | None) -> Released | None:
    """What a decision object says, when it is for this run and signed with its key (a runner started by
    hand, without a key, takes it unsigned); None otherwise."""
    obj = read_signed(raw, key, STAGE, job_id, run_id, max_bytes=MAX_DECISION_BYTES)
    if obj is None:
        return None
    through, cap = obj.get("through"), obj.get("max_cost")
    if not isinstance(through, int) or isinstance(through, bool):
        return None
    if cap is not None and (not isinstance(cap, (int, float)) or isinstance(cap, bool) or not cap > 0):
        return None
    return Released(through, float(cap) if cap is not None else None)
