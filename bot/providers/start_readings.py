"""How long a runner's start takes on this machine, read from the local provider's own finished runners.

The quote's start-up phase on the local CPU was the development machine's import time (torch, transformers,
peft: 3.9 s) scaled by this machine's Python speed (bot/providers/host_speed.py). An import is only partly
Python: reading and mapping libraries, initializing C extensions do not slow down with the interpreter, so
on a machine whose Python ran at 0.63 of the development one's the plain start was quoted 6.2 s and took
4.4-4.7, and a start forked from the prewarmed process (bot/providers/prewarm.py) was quoted 0.8 s and took
0.2-0.4. Every runner measures its own start (runner/contract/phases.py "start") and prints it in the summary
that ends its log; this module reads that line once a runner has exited and keeps the readings in the
provider's folder (``start-seconds.json``, shared by every process on it, as the other readings of this
machine are), each brought to a whole core: ``seconds x host share`` at its launch (a start beside other work
gets a share of a core and takes 1/share as long). The offer carries the median of the last few of each kind
(plain, forked); the planner divides it by the share a run started now gets (bot/planner/phases.py).

Standard library only: the bot imports it.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

FILE = "start-seconds.json"
KEEP = 20  # readings kept (the newest), of both kinds
KEEP_READ = 2000  # ids of the runners already read: more than the provider remembers, so none is read twice
MEDIAN_OF = 3  # the offer's figure: the median of this many newest readings of a kind
MAX_AGE_S = 7 * 86400.0  # a week-old start says little of this machine now (an upgrade, a new disk)
TAIL_BYTES = 64 * 1024  # the summary is the log's last line; a log is read from its end only
MAX_START_S = 3600.0  # a start longer than this is not a start (a hung host, a clock jump): not kept


def summary_start(log: Path) -> float | None:
    """The ``phases.start`` of the run summary that ends a runner's log (runner/cli.py: its last stdout
    line), None when the log has none (the runner was killed before it wrote one)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if not line.startswith("{") or '"phases"' not in line:
            continue
        try:
            start = (json.loads(line).get("phases") or {}).get("start")
        except (ValueError, AttributeError):
            return None
        if isinstance(start, int | float) and not isinstance(start, bool) and 0 < start < MAX_START_S:
            return float(start)
        return None
    return None


def _load(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """(the readings, the ids of every runner already read) of the folder's file."""
    try:
        raw = json.loads(path.read_text())
        readings, read = raw["readings"], raw["read"]
    except (OSError, ValueError, TypeError, KeyError):
        return [], []
    if not isinstance(readings, list) or not isinstance(read, list):
        return [], []
    return [r for r in readings if isinstance(r, dict)], [str(i) for i in read]


def share_over(
    started: float, seconds: float, others: Iterable[tuple[float, float]], cores: float, other_work: float
) -> float:
    """The share of a core a start got over its own ``seconds`` from ``started`` (pure): the ``cores`` over
    itself, the runners that overlapped it (each ``(start, end)`` counted for the part of the start it
    overlapped) and the cores' worth of other work at its launch. The share at its launch alone read a
    sweep's first run as alone on the machine while three more and a prewarmed process started beside it: its
    20 s start was kept as 20 s at a whole core, and the next single run was quoted 2-3x its start."""
    if seconds <= 0:
        return 1.0
    end = started + seconds
    overlap = sum(max(0.0, min(end, b) - max(started, a)) for a, b in others) / seconds
    return min(1.0, max(cores, 1.0) / (1.0 + overlap + max(0.0, other_work)))


def record(
    folder: Path,
    finished: Iterable[dict[str, Any]],
    *,
    now: float | None = None,
    spans: Callable[[], dict[str, tuple[float, float]]] | None = None,
) -> list[dict]:
    """Add the starts of ``finished`` runners not read yet (each: ``id``, ``log``, ``forked``, and ``share``,
    its host share at launch, or what ``share_over`` needs: ``started_at``, ``cores``, ``other_work``) to the
    folder's readings; returns the readings kept. ``spans``: every runner's (start, end) by id, the runners
    beside a start (asked once, and only when a runner is read). Each runner is read once (its id kept,
    whether or not its log had a summary)."""
    from bot.providers.host_speed import save_reading

    path = folder / FILE
    now = time.time() if now is None else now
    readings, read = _load(path)
    kept = [r for r in readings if 0 <= now - float(r.get("at", 0)) <= MAX_AGE_S]
    known = set(read)
    changed = len(kept) != len(readings)
    ran: dict[str, tuple[float, float]] | None = None
    for runner in finished:
        if runner["id"] in known:
            continue
        known.add(runner["id"])
        read.append(runner["id"])
        changed = True
        seconds = summary_start(Path(runner["log"]))  # None: killed before its summary
        if seconds is None:
            continue
        if runner.get("started_at") is not None and runner.get("cores"):
            if ran is None:
                ran = spans() if spans is not None else {}
            share = share_over(
                float(runner["started_at"]),
                seconds,
                [span for other, span in ran.items() if other != runner["id"]],
                float(runner["cores"]),
                float(runner.get("other_work") or 0.0),
            )
        else:
            share = float(runner.get("share") or 1.0)
        share = min(1.0, max(share, 0.05))
        kept.append({"at": now, "forked": bool(runner["forked"]), "seconds": round(seconds * share, 4)})
    kept = kept[-KEEP:]
    if changed:
        save_reading(path, {"readings": kept, "read": read[-KEEP_READ:]})
    return kept


def typical(readings: list[dict[str, Any]], *, forked: bool) -> float | None:
    """A start of this kind at a whole core: the median of the newest MEDIAN_OF readings, None without any."""
    values = [float(r["seconds"]) for r in readings if bool(r.get("forked")) == forked and r.get("seconds")]
    return round(statistics.median(values[-MEDIAN_OF:]), 3) if values else None
