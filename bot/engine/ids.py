"""What a job id looks like, checked wherever one comes in (chat, buttons, the console, the CLI,
/runner/events) before any lookup: a NUL, a newline or a megabyte of text never reaches the database (a
NUL is an error in PostgreSQL, not a miss) or a log line (a newline would forge one)."""

from __future__ import annotations

import re

from bot.engine.api import EngineError

# The engine makes 12 hex digits (uuid4); imports and tests use short readable ids ("j1", "job-7").
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def shown(value: object, limit: int = 40) -> str:
    """A value someone sent, safe for a log line or a message: quoted, control characters escaped, short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_job_id(value: object) -> str:
    """The job id itself; EngineError (a friendly refusal) when it cannot be one."""
    if not is_job_id(value):
        raise EngineError(f"{shown(value)} is not a job id (see `jobs`)")
    return value  # type: ignore[return-value]
