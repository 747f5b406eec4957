"""Runner events as a job's own runner sends them: signed with its current run's key
(runner/contract/integrity.py).

The bot accepts only events the key of the job's current run signed (bot/engine/launching/integrity.py); a
test that plays the runner signs with the key the run's instance got (TUNEBOT_JOB_KEY), derived here from the
engine's master key and the run's secret.
"""

from __future__ import annotations

from typing import Any

from runner.contract.integrity import EVENT, sign


def job_key(engine: Any, job_id: str) -> bytes | None:
    """The key the job's current instance got (``engine``: an Engine or an EngineContext); None when the job
    has no current run."""
    from bot.engine.launching.integrity import current_key

    found = current_key(getattr(engine, "ctx", engine), job_id)
    return found[1] if found is not None else None


def signed(engine: Any, item: dict[str, Any]) -> dict[str, Any]:
    """``item`` (an event object) with the MAC its job's current run would add."""
    return sign(job_key(engine, item["job_id"]), EVENT, item)


def signed_all(engine: Any, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [signed(engine, i) for i in items]


def checkpoint_event(engine: Any, job_id: str, seq: int, step: int, folder: str, **kw: Any) -> dict[str, Any]:
    """The signed event a run sends once it saved ``<folder>/checkpoint-<step>`` (its manifest's digest with
    it): what makes the bot acknowledge the checkpoint (bot/engine/record/runs.py)."""
    import hashlib

    item = {
        "version": 1,
        "job_id": job_id,
        "seq": seq,
        "kind": "checkpoint",
        "step": step,
        "checkpoint_uri": f"{folder.rstrip('/')}/checkpoint-{step}",
        "manifest_sha256": hashlib.sha256(f"{job_id}:{folder}:{step}".encode()).hexdigest(),
        "timestamp": float(seq),
        **kw,
    }
    return signed(engine, item)
