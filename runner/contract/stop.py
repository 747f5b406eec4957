"""The bot's word to a runner to stop: save a checkpoint, report it, exit.

On the local provider the bot SIGTERMs the runner's process. On a cloud it has no signal path to the runner:
terminating the instance kills it, and the work since its last timed checkpoint is lost and billed again. So
before the bot ends a live runner (a person's ``stop``, a sweep dropping a run, a budget), it writes a small
``stop`` object beside the run's checkpoints (``request_uri``), signed with the run's own key
(runner/contract/integrity.py, purpose ``stop``), naming the job, the run and why. The runner looks for it at
every heartbeat, from its reporter's thread (runner/report.py), and treats it as SIGTERM: it finishes the
current step, saves, reports the checkpoint in its ``preempted`` event and exits 75. The bot waits a bounded
grace for that report (bot/engine/watching/supervise.py), acknowledges the checkpoint, then terminates.

Only the run's key makes a request the run obeys: an object another run's host (or anyone who can write the
bucket) puts there is ignored, and the worst it can do is nothing. A request is for one run (its folder and
its id): the next run of the job has its own folder and key, so an old request never stops it.

Pure but for reading the object: the bot writes what ``request`` makes, the runner reads it with ``asked``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runner.contract.integrity import read_signed, sign

STOP = "stop"  # the MAC's purpose: a stop request can never pass for an event, a manifest or a decision
STOP_FILE = "stop.json"
MAX_REQUEST_BYTES = 4096
REASON = re.compile(r"^[a-z][a-z0-9 _-]{0,39}$")  # the bot's stop reasons: user, budget, sweep, idle, ...


def request_uri(checkpoint_uri: str) -> str:
    """Where a run finds the bot's stop request: ``<its checkpoint folder>/stop.json``."""
    return f"{checkpoint_uri.rstrip('/')}/{STOP_FILE}"


def request(key: bytes | None, job_id: str, run_id: str | None, *, reason: str) -> bytes:
    """The object that asks run ``run_id`` of the job to stop, for ``reason`` (signed with the run's key)."""
    if not REASON.match(reason):
        reason = "stop"
    body: dict[str, Any] = {"version": 1, "job_id": job_id, "run_id": run_id, "reason": reason}
    return json.dumps(sign(key, STOP, body), separators=(",", ":")).encode()


def asked(raw: bytes, key: bytes | None, job_id: str, run_id: str | None) -> str | None:
    """Why the bot asks this run to stop, when ``raw`` is a request for this job and run signed with its key
    (a runner started by hand, without a key, takes it unsigned); None otherwise."""
    obj = read_signed(raw, key, STOP, job_id, run_id, max_bytes=MAX_REQUEST_BYTES)
    if obj is None:
        return None
    reason = obj.get("reason")
    return reason if isinstance(reason, str) and REASON.match(reason) else None
