"""The MAC check's fast path (orjson's canonical bytes) gives the exact check's verdict on every object.

bot/engine/launching/integrity.refusal first tries the bytes orjson writes (a first read checks ~200,000
events); where they differ from runner.contract.integrity.canonical's (non-ASCII text, exponents, NaN, big
integers) the MAC does not match them and the exact check decides. These objects cover both sides of every
such difference.
"""

from __future__ import annotations

import math

import pytest

from bot.engine.launching import integrity
from runner.contract.integrity import EVENT, canonical, sign

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))

BODIES = [
    {"job_id": "j1", "seq": 3, "kind": "progress", "step": 30, "loss": 1.997, "timestamp": 1733320000.123},
    {"job_id": "j1", "seq": 0, "kind": "started", "message": "héllo \u2028 wörld ☃", "timestamp": 1.0},
    {"job_id": "j1", "seq": 1, "loss": 1e-07, "eta_seconds": 1e16, "timestamp": 2.5e-5},
    {"job_id": "j1", "seq": 2, "loss": math.nan, "eta_seconds": math.inf, "timestamp": 3.0},
    {"job_id": "j1", "seq": 2**70, "timestamp": 4},
    {
        "job_id": "j1",
        "seq": 5,
        "metrics": {"b": [1, 2.0, None, True], "a": {"z": "\x00\x7f/"}},
        "timestamp": 5,
    },
    {"z": 1, "a": 2, "é": 3, "B": 4},
]


@pytest.mark.parametrize("body", BODIES)
def test_the_fast_path_agrees_with_the_exact_check(body: dict) -> None:
    signed = sign(KEY, EVENT, body)
    forged = {**signed, "seq": 999}
    wrong_key = sign(OTHER, EVENT, body)
    unsigned = dict(body)
    for item, expected in (
        (signed, None),
        (forged, "unsigned"),
        (wrong_key, "unsigned"),
        (unsigned, "unsigned"),
    ):
        assert integrity.refusal(KEY, item) == expected
        assert _exact(KEY, item) == expected
        assert integrity.signed_event(KEY, item) is (expected is None)  # where a tail read stops


def test_a_large_event_is_refused_as_too_large_on_both_paths() -> None:
    big = sign(
        KEY, EVENT, {"job_id": "j1", "seq": 1, "message": "x" * integrity.MAX_EVENT_BYTES, "timestamp": 1}
    )
    assert integrity.refusal(KEY, big) == "too_large"


def test_the_fast_bytes_are_canonical_for_a_runners_ordinary_event() -> None:
    """The fast path is only fast if it matches what the runner signs for the events it writes every 30 s."""
    item = sign(KEY, EVENT, BODIES[0])
    assert integrity._fast_canonical(item) == canonical(item)


def _exact(key: bytes, item: dict) -> str | None:
    """The check before the fast path: canonical bytes, size cap, MAC."""
    from runner.contract.integrity import verify

    body = canonical(item)
    if len(body) > integrity.MAX_EVENT_BYTES:
        return "too_large"
    return None if verify(key, EVENT, item, body) else "unsigned"


def test_run_keys_loaded_together_are_the_ones_read_one_by_one(make_engine) -> None:  # type: ignore[no-untyped-def]
    """A restarted bot's first tick loads every running job's run key in a few queries (progress.pull_many):
    the same keys ``run_key`` derives one by one; a run of another job, or none at all, gives nothing."""
    from store.models import JobRun

    engine = make_engine()
    with engine.session() as s:
        for k in range(3):
            s.add(JobRun(id=f"r{k}", job_id=f"j{k}", secret=f"{k:02x}" * 16, created_at=1.0))
        s.commit()
    one_by_one = {k: integrity.run_key(engine.ctx, f"j{k}", f"r{k}") for k in range(3)}
    fresh = make_engine()
    integrity.load_run_keys(fresh.ctx, {"j0": "r0", "j1": "r1", "j2": "r0", "j3": "missing", "j4": None})
    cache = fresh.ctx.memory.run_keys
    assert cache == {("j0", "r0"): one_by_one[0], ("j1", "r1"): one_by_one[1]}
    assert integrity.current_key(fresh.ctx, "j2", "r0") is None  # r0 is j0's run: not j2's
    assert integrity.current_key(fresh.ctx, "j1", "r1") == ("r1", one_by_one[1])


def test_run_keys_of_many_running_jobs_are_the_ones_read_one_by_one(make_engine) -> None:  # type: ignore[no-untyped-def]
    """Past 500 runs (a restarted bot's first tick at scale) the keys come from one query over the active
    jobs' current runs: the same keys as one by one; a finished job's run, a run of another job, a
    superseded run and a job with no run give nothing from it."""
    from sqlalchemy import insert

    from store.models import Job, JobRun

    n = 620
    engine = make_engine()
    jobs = [
        Job(
            id=f"j{k}",
            owner="u",
            state="running",
            request={},
            offer={},
            run_id=f"r{k}",
            created_at=1.0,
            updated_at=1.0,
        ).model_dump()
        for k in range(n)
    ]
    jobs[0]["state"] = "succeeded"  # not active: its run is not among those read at once
    jobs[1]["run_id"] = "r1-new"  # superseded: r1 is no longer its current run
    runs = [
        JobRun(id=f"r{k}", job_id=f"j{k}", secret=f"{k % 256:02x}" * 16, created_at=1.0).model_dump()
        for k in range(n)
    ]
    with engine.session() as s:
        s.execute(insert(Job.__table__), jobs)
        s.execute(insert(JobRun.__table__), runs)
        s.commit()
    one_by_one = {k: integrity.run_key(engine.ctx, f"j{k}", f"r{k}") for k in range(2, n)}
    fresh = make_engine()
    wanted = {f"j{k}": f"r{k}" for k in range(n)} | {"j2": "r3", "j-none": None}
    integrity.load_run_keys(fresh.ctx, wanted)
    cache = fresh.ctx.memory.run_keys
    assert cache == {(f"j{k}", f"r{k}"): one_by_one[k] for k in range(4, n)} | {("j3", "r3"): one_by_one[3]}
    # what the one query did not bring is still found one by one, as before
    assert integrity.current_key(fresh.ctx, "j0", "r0") is not None
