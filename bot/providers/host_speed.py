"""How fast this machine runs Python, against the machine the CPU's constants were measured on.

The local provider's runner spends its start-up in Python (importing torch, transformers and peft: module
code run and unmarshalled) and a tiny model's step in dispatch (Python and C++ per op), so both scale with
the interpreter's speed on this CPU. The planner's CPU constants (bot/planner/phases.IMPORT_SECONDS,
speed.OP_SECONDS, speed.LOGGING_SECONDS_PER_STEP) were measured on the development machine; a machine of the
same kind measured 1.85x slower on all of them at once (imports 7.2 s against 3.9 s, the steps of
bench/quote_vs_run.py's first shape 14.1 s against 7.6 s) while its fp32 GEMM ran as fast. So the offer
carries the ratio of a short Python probe here to the probe on the development machine, and the quote's
host-side seconds are divided by it: a mechanism measured where the run will run, not a constant from
another machine.

The probe is dict and integer work in a loop (what module execution and dispatch are made of), timed in
short repeats and the fastest kept: a repeat that another process pre-empted says nothing of the CPU; the
cores' sharing is priced apart (bot/planner/plan.cpu_share).
"""

from __future__ import annotations

import threading
import time
from collections import deque

# The probe's fastest repeat on the development machine (seconds). Measured here as 2.20 ms on the machine
# 1.85x slower (its imports and steps above), so 2.20 / 1.85.
REFERENCE_PROBE_S = 2.20e-3 / 1.85
REPEATS = 15
ITERATIONS = 20_000
BOUNDS = (0.2, 5.0)  # a probe outside these says more about the moment than the machine


def cores_probe_seconds(repeats: int = REPEATS) -> float:
    """The probe on each core this process may use (up to four), this thread pinned to it in turn; the
    fastest core's time: what a core of this CPU does when nothing else runs on it (what else runs there is
    priced apart, as the run's share of the cores). Unpinned, one process in three read half the machine's
    speed: one core of a cloud VM can run at half the other's pace for seconds at a time (seen here: 2.2 ms
    on one, 3.6-4.0 ms on the other, then both 2.2 ms), and a core busy with another process's imports does
    too."""
    import os

    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: the core the scheduler gives
        return probe_seconds(repeats)
    times = []
    try:
        for core in allowed[:4]:
            os.sched_setaffinity(0, {core})  # this thread only
            times.append(probe_seconds(repeats))
    finally:
        os.sched_setaffinity(0, allowed)
    return min(times)


def probe_seconds(repeats: int = REPEATS) -> float:
    """The fastest of ``repeats`` runs of the probe."""
    best = float("inf")
    for _ in range(repeats):
        table: dict[int, int] = {}
        start = time.perf_counter()
        for i in range(ITERATIONS):
            key = i % 997
            table[key] = table.get(key, 0) + i
        best = min(best, time.perf_counter() - start)
    return best


REPROBE_S = 600.0  # a serving bot probes again every ten minutes and keeps the best of its last three
_lock = threading.Lock()
_probes: deque[tuple[float, float]] = deque(maxlen=3)  # (monotonic time, speed)


def python_speed() -> float:
    """This machine's Python speed as a multiple of the development machine's (0.54 is 1.85x slower): the
    best of the last three probes (~60 ms each), one every REPROBE_S at most. A whole probe slowed by a
    moment's contention (seen: 1 in 8 at 0.30 where the others read 0.52-0.57) does not set the quotes."""
    with _lock:
        now = time.monotonic()
        if not _probes or now - _probes[-1][0] > REPROBE_S:
            low, high = BOUNDS
            _probes.append((now, min(high, max(low, REFERENCE_PROBE_S / cores_probe_seconds()))))
        return round(max(speed for _, speed in _probes), 3)
