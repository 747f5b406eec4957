"""The local quote's start-up is what a runner's start took on this machine, read from its own finished
runners (issue 36): the development machine's import time scaled by this machine's Python speed quoted a
plain start 6.2 s that took 4.4-4.7 s (an import is only partly Python), and a forked one 0.8 s that took
0.2-0.4 s."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from bot.planner.gpus import cpu_device
from bot.planner.phases import import_seconds
from bot.providers import start_readings
from bot.providers.local import LocalProvider


def _log(path: Path, start: float | None, *, tail: str = "") -> Path:
    lines = ["loading the model", "step 10/10 loss 1.0"]
    if start is not None:
        lines.append(json.dumps({"status": "finished", "steps": 10, "phases": {"start": start, "load": 0.2}}))
    path.write_text("\n".join(lines) + "\n" + tail)
    return path


def test_a_start_is_read_once_from_the_summary_ending_a_runners_log_at_a_whole_core(tmp_path: Path) -> None:
    a = _log(tmp_path / "a.log", 4.0)
    b = _log(tmp_path / "b.log", None)  # killed before its summary
    c = _log(tmp_path / "c.log", 0.6)
    finished = [
        {"id": "a", "log": str(a), "forked": False, "share": 0.5},  # beside other work: half a core
        {"id": "b", "log": str(b), "forked": False, "share": 1.0},
        {"id": "c", "log": str(c), "forked": True, "share": 1.0},
    ]
    kept = start_readings.record(tmp_path, finished, now=1000.0)
    assert start_readings.typical(kept, forked=False) == 2.0  # 4 s on half a core: 2 s on a whole one
    assert start_readings.typical(kept, forked=True) == 0.6
    a.write_text("")  # each is read once: the reading stays when the log goes
    assert start_readings.record(tmp_path, finished, now=1001.0) == kept
    later = start_readings.record(tmp_path, [], now=1000.0 + start_readings.MAX_AGE_S + 1)
    assert start_readings.typical(later, forked=False) is None  # a week later: nothing this old is kept


def test_the_median_of_the_newest_readings_of_a_kind(tmp_path: Path) -> None:
    finished = []
    for i, start in enumerate([9.0, 3.0, 4.0, 30.0, 5.0]):  # one slow start among the newest is outvoted
        finished.append({"id": f"r{i}", "log": str(_log(tmp_path / f"{i}.log", start)), "forked": False})
    kept = start_readings.record(tmp_path, finished, now=0.0)
    assert start_readings.typical(kept, forked=False) == 5.0  # median of 4, 30, 5
    assert start_readings.typical(kept, forked=True) is None


def test_a_start_is_brought_to_a_whole_core_by_the_runners_beside_it_over_its_own_seconds(
    tmp_path: Path,
) -> None:
    """A sweep launches its runs one after the other: its first run's launch saw the machine empty, yet three
    more (and their imports) started beside it. Read at the share its launch saw, its 20 s start was kept as
    20 s at a whole core and the next single run's start quoted 2-3x what it took; read over its own seconds,
    it is 20 s at half a core (four on two cores)."""
    assert start_readings.share_over(0.0, 20.0, [], cores=2, other_work=0.0) == 1.0  # alone
    beside = [(0.5, 30.0), (1.0, 30.0), (1.5, 30.0)]  # three launched just after it, all through its start
    assert start_readings.share_over(0.0, 20.0, beside, cores=2, other_work=0.0) == pytest.approx(2 / 3.85)
    assert (
        start_readings.share_over(0.0, 20.0, [(-100.0, -1.0), (25.0, 40.0)], cores=1, other_work=0.0) == 1.0
    )
    assert start_readings.share_over(0.0, 10.0, [(5.0, 30.0)], cores=1, other_work=0.5) == pytest.approx(0.5)
    first = {"id": "r1", "log": str(_log(tmp_path / "r1.log", 20.0)), "forked": False, "share": 1.0}
    ran = {"r1": (0.0, 30.0), **{f"r{i + 2}": span for i, span in enumerate(beside)}}  # its own span left out
    kept = start_readings.record(
        tmp_path,
        [{**first, "started_at": 0.0, "cores": 2, "other_work": 0.0}],
        now=100.0,
        spans=lambda: ran,
    )
    assert kept[-1]["seconds"] == pytest.approx(20.0 * 2 / 3.85, abs=1e-3)


def test_a_summary_that_is_not_a_start_is_not_kept(tmp_path: Path) -> None:
    for bad in ('{"phases": {"start": -1}}', '{"phases": {"start": true}}', '{"phases": "x"}', "{not json"):
        (tmp_path / "x.log").write_text(f"line\n{bad}\n")
        assert start_readings.summary_start(tmp_path / "x.log") is None, bad
    assert start_readings.summary_start(tmp_path / "missing.log") is None


def test_the_quote_divides_the_measured_start_by_the_share_a_start_now_gets() -> None:
    measured = cpu_device(2, 1, speed=0.63, start_s=4.5, fork_s=0.3)
    assert import_seconds(measured) == pytest.approx(4.5)
    assert import_seconds(measured, warm=True) == pytest.approx(0.3)
    crowded = cpu_device(2, 4, speed=0.63, start_s=4.5, fork_s=0.3)  # four runs on two cores: half a core
    assert import_seconds(crowded) == pytest.approx(9.0)
    assert import_seconds(cpu_device(2, 1, speed=0.63)) == pytest.approx(3.9 / 0.63)  # none measured yet


SUMMARY = 'import json; print("step 1/1"); print(json.dumps({"status": "ok", "phases": {"start": 1.25}}))'


def test_the_local_offer_carries_what_its_own_finished_runner_took_to_start(tmp_path: Path) -> None:
    """A runner launched by the local provider prints its summary and exits; the next offer carries its start
    (no prewarmed process here: a plain start), at a whole core (this machine was quiet: share 1)."""
    from bot.providers.base import LaunchRequest

    provider = LocalProvider(workdir=tmp_path, runner_command=[sys.executable, "-c", SUMMARY])
    offer = provider.offer()
    assert offer.start_seconds is None
    inst = provider.launch(LaunchRequest(job_id="j1", offer=offer, image=""))
    deadline = time.time() + 60
    while time.time() < deadline and provider.status(inst.instance_id).exit_code is None:
        time.sleep(0.1)
    rec = json.loads((tmp_path / "instances.json").read_text())[inst.instance_id]
    assert rec["forked"] is False and 0 < rec["host_share"] <= 1
    after = provider.offer()
    assert after.start_seconds == pytest.approx(1.25 * rec["host_share"], abs=1e-3)
    assert after.fork_seconds is None


def test_more_finished_runners_than_readings_kept_are_each_read_once(tmp_path: Path) -> None:
    """The provider remembers finished runners for a week; the readings keep the newest KEEP: a runner whose
    reading was dropped is not read again as if new (it would push the newer readings out)."""
    n = start_readings.KEEP + 10
    finished = [
        {"id": f"r{i}", "log": str(_log(tmp_path / f"{i}.log", 1.0 + i)), "forked": False} for i in range(n)
    ]
    kept = start_readings.record(tmp_path, finished, now=0.0)
    assert len(kept) == start_readings.KEEP and kept[-1]["seconds"] == float(n)
    before = (tmp_path / start_readings.FILE).read_text()
    assert start_readings.record(tmp_path, finished, now=1.0) == kept
    assert (tmp_path / start_readings.FILE).read_text() == before  # nothing read again, nothing written
