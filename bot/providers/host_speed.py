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

import json
import os
import threading
import time
from pathlib import Path

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


REPROBE_S = 600.0  # a probe is taken again after ten minutes; the best of the last three is kept
KEPT = 3
_lock = threading.Lock()
_probes: list[tuple[float, float]] = []  # (wall time, speed): this process's, where no file keeps them


def python_speed(history: Path | None = None) -> float:
    """This machine's Python speed as a multiple of the development machine's (0.54 is 1.85x slower): the
    best of the last three probes (~60 ms each), one every REPROBE_S at most. A whole probe slowed by a
    moment's contention (seen: 1 in 8 at 0.30 where the others read 0.52-0.57) does not set the quotes.

    ``history``: a file the probes are kept in, shared by every process on it (the local provider's
    workdir). Each process probing for itself quoted the same request differently at two doors a minute
    apart under load (the CLI $0.0003, the console $0.0002)."""
    with _lock:
        probes = _load(history) if history is not None else list(_probes)
        now = time.time()
        if not probes or not 0 <= now - probes[-1][0] <= REPROBE_S:
            low, high = BOUNDS
            probes = [*probes, (now, min(high, max(low, REFERENCE_PROBE_S / cores_probe_seconds())))][-KEPT:]
            if history is None:
                _probes[:] = probes
            else:
                save_reading(history, probes)
        return round(max(speed for _, speed in probes), 3)


def _load(path: Path) -> list[tuple[float, float]]:
    try:
        saved = json.loads(path.read_text())
        low, high = BOUNDS
        return [(float(t), float(v)) for t, v in saved[-KEPT:] if low <= float(v) <= high]
    except (OSError, ValueError, TypeError):  # none yet, or unreadable: probe again
        return []


def save_reading(path: Path, data: object) -> None:
    """Write a reading of this machine shared by the processes on its folder (the probes here, the local
    provider's busy cores): atomically, so a reader sees the old reading or the new, never half; on a
    read-only folder not at all (the process's own reading still answers)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
