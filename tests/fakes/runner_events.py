"""Runner events as a job's own runner sends them: signed with the job's key (runner/integrity.py).

The bot accepts only events its job's key signed (bot/engine/integrity.py); a test that plays the runner
signs with the key the job's instance got (TUNEBOT_JOB_KEY), derived here from the engine's master key.
"""

from __future__ import annotations

from typing import Any

from runner.integrity import EVENT, sign


def job_key(engine: Any, job_id: str) -> bytes:
    """The key the job's instance gets (``engine``: an Engine or an EngineContext)."""
    from bot.engine.integrity import job_key as derive

    return derive(getattr(engine, "ctx", engine), job_id)


def signed(engine: Any, item: dict[str, Any]) -> dict[str, Any]:
    """``item`` (an event object) with the MAC its job's runner would add."""
    return sign(job_key(engine, item["job_id"]), EVENT, item)


def signed_all(engine: Any, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [signed(engine, i) for i in items]
