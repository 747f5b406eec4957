"""The local CPU's quote follows this machine's Python speed, probed where the runner will run (issue 36: a
machine 1.85x slower than the development one ran every local job well over its quote: the start-up alone
7.2 s against 3.9 s, four cold sweep runs 24 s against 7.8 s)."""

from __future__ import annotations

import json

import pytest

from bot.planner.gpus import cpu_device
from bot.planner.phases import import_seconds
from bot.providers import host_speed
from bot.providers.local import LocalProvider


def test_a_slower_cpu_is_quoted_a_slower_start_and_dispatch_but_the_same_gemms() -> None:
    from bot.planner.architectures import from_config
    from bot.planner.request import EstimateRequest
    from bot.planner.speed import estimate_speed
    from tests.planner.test_dispatch import TINY

    here, half = cpu_device(2, 1), cpu_device(2, 1, speed=0.5)
    assert import_seconds(half) == pytest.approx(2 * import_seconds(here))
    arch = from_config(TINY).adapt("all-linear")
    req = EstimateRequest(model="tiny", seq_len=64)
    fast, slow = (estimate_speed(arch, req, d).parts or {} for d in (here, half))
    assert slow["dispatch"] == pytest.approx(2 * fast["dispatch"])
    assert slow["matmul"] == pytest.approx(fast["matmul"])  # big GEMMs ran as fast on the slower machine
    assert slow["step"] > 1.5 * fast["step"]


def test_the_local_offer_carries_the_probed_speed(tmp_path) -> None:
    offer = LocalProvider(workdir=tmp_path).offer()
    assert offer.cpu_speed == host_speed.python_speed(tmp_path / "python-speed.json")
    assert host_speed.BOUNDS[0] <= offer.cpu_speed <= host_speed.BOUNDS[1]


def test_one_slow_probe_does_not_set_the_quotes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The best of the last three probes: a probe slowed by a moment's contention is outvoted by the next."""
    monkeypatch.setattr(host_speed, "_probes", [])
    readings = iter([host_speed.REFERENCE_PROBE_S / 0.3, host_speed.REFERENCE_PROBE_S / 0.55])
    monkeypatch.setattr(host_speed, "cores_probe_seconds", lambda: next(readings))
    clock = iter([0.0, 10.0, 10.0 + host_speed.REPROBE_S + 1])
    monkeypatch.setattr(host_speed.time, "time", lambda: next(clock))
    assert host_speed.python_speed() == 0.3  # the first probe, contended
    assert host_speed.python_speed() == 0.3  # not probed again within REPROBE_S
    assert host_speed.python_speed() == 0.55  # probed again: the better reading wins


def test_every_door_on_one_machine_quotes_from_the_same_readings(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes (two providers here, each probing for itself) on one workdir read one speed and one
    busy figure: on fa789d0 the CLI quoted $0.0003 and the console $0.0002 for one request a minute apart."""
    readings = iter([host_speed.REFERENCE_PROBE_S / 0.5, host_speed.REFERENCE_PROBE_S / 0.8])
    monkeypatch.setattr(host_speed, "cores_probe_seconds", lambda: next(readings))

    class Busy:
        def __init__(self, cores: float) -> None:
            self.cores = lambda: cores

    first, second = LocalProvider(workdir=tmp_path), LocalProvider(workdir=tmp_path)
    first._busy, second._busy = Busy(1.4), Busy(0.1)  # noqa: SLF001
    a, b = first.offer(), second.offer()
    assert (
        (a.cpu_speed, a.cpu_busy, a.cpu_threads) == (b.cpu_speed, b.cpu_busy, b.cpu_threads) == (0.5, 1.4, 1)
    )
    assert second.thread_share() == first.thread_share()  # and the launch gets the threads the quote priced
    # a run started here is a change the next quote reads afresh; once it ends, the reading from before holds
    saved = json.loads((tmp_path / "cores-busy.json").read_text())
    (tmp_path / "cores-busy.json").write_text(json.dumps({"1": saved["0"]}))
    assert second.offer().cpu_busy == 0.1
    (tmp_path / "cores-busy.json").write_text(json.dumps({**saved, "1": {"at": 0, "cores": 2.0}}))
    assert second.offer().cpu_busy == 1.4
