"""The runner's heartbeat: its liveness, apart from its (possibly rare, possibly slow) progress reports.

A runner's progress reports come every ``report.every_seconds`` (TUNEBOT_REPORT_EVERY: an hour if someone
wants it so), and a long eval or checkpoint upload can hold them up further. Whether the runner lives must not
depend on that (issue 38: an hourly-reporting runner at step 647 was declared dead, and relaunched from step
0). So the runner's reporter writes, from its own thread, a small signed heartbeat at the head of its progress
object (``progress.json``: the first key, so the bot reads it without parsing the events) every
``report.heartbeat_seconds``, whether or not there is anything to report, through evals and uploads alike.

A beat says which runner process wrote it (its start, on the host's clock), its number within that process,
the step, and how long the runner has gone without progress (a step or an event) as it measured it. The bot
(bot/engine/watching/progress.py) counts a beat only when this run's key signed it and it is newer than the
last one it counted (a beat written again, or an older one put back, proves nothing), and then only as a
bounded claim: a silent runner is declared dead by the provider's view or the heartbeat timeout, never kept
alive past its spend cap by what its host says.

Standard library only (the bot imports it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.contract.integrity import sign, verify

PURPOSE = "heartbeat"  # the MAC's purpose tag: a beat never passes for an event or a manifest
FIELD = "heartbeat"  # the progress object's first key
HEAD = b'{"heartbeat": '  # how the reporter's json.dumps starts an object that carries a beat
MAX_BYTES = 512  # a beat is ~250 bytes with its MAC; anything longer is not a runner's beat
EVERY_MAX_S = 30.0  # at most this long between beats (a bot with a long timeout still hears of a death soon)
EVERY_MIN_S = 1.0  # at least this long between beats (every beat rewrites the progress object)
BEATS_PER_TIMEOUT = 4  # beats the bot may miss in a row before it counts the runner silent


def every(timeout_s: float) -> float:
    """How often a runner beats for a bot whose heartbeat timeout is ``timeout_s``: four beats per timeout, at
    most every 30 s and at least every second apart. The bot puts it in the spec (report.heartbeat_seconds);
    bot/settings.py refuses a timeout that this cadence and the supervisor's tick cannot serve."""
    return max(EVERY_MIN_S, min(EVERY_MAX_S, timeout_s / BEATS_PER_TIMEOUT))


@dataclass(frozen=True)
class Beat:
    """One heartbeat, as the runner claims it."""

    job_id: str
    born: float  # when the runner process that beats started (host clock): a new process counts from 0 again
    beat: int  # 0, 1, 2, ... within that process
    step: int  # the optimizer step the runner is at
    stalled_s: float  # seconds since the runner last made progress (a step, an event), by its own clock

    @property
    def order(self) -> tuple[float, int]:
        """Beats of one run in the order they were written: a later process, else a later beat."""
        return (self.born, self.beat)

    def signed(self, key: bytes | None) -> dict[str, Any]:
        """The beat as the progress object carries it (its MAC added when the runner has a key)."""
        body = {
            "job_id": self.job_id,
            "born": round(self.born, 6),
            "beat": self.beat,
            "step": self.step,
            "stalled_s": round(max(0.0, self.stalled_s), 3),
        }
        return sign(key, PURPOSE, body)


def parse(obj: Any, key: bytes, job_id: str) -> Beat | None:
    """The beat of ``obj`` when this run's ``key`` signed it for this job and its fields are in bounds; None
    otherwise. Pure."""
    if not isinstance(obj, Mapping) or not verify(key, PURPOSE, obj) or obj.get("job_id") != job_id:
        return None
    born, beat, step, stalled = obj.get("born"), obj.get("beat"), obj.get("step"), obj.get("stalled_s")
    numbers = (born, beat, step, stalled)
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in numbers):
        return None
    if not isinstance(beat, int) or not isinstance(step, int) or beat < 0 or step < 0 or stalled < 0:
        return None
    return Beat(job_id, float(born), beat, step, float(stalled))


def head(raw: bytes) -> Any:
    """The beat object at the head of a progress object's bytes, decoded alone (the events after it are not
    parsed); None when the object does not start with one (a runner from before heartbeats)."""
    if not raw.startswith(HEAD):
        return None
    start = len(HEAD)
    end = raw.find(b"}", start, start + MAX_BYTES)  # a beat holds no nested object: its first } ends it
    if end == -1:
        return None
    try:
        return json.loads(raw[start : end + 1])
    except ValueError:
        return None
