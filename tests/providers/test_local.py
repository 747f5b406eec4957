"""LocalProvider: real processes, persisted state, preemption by SIGTERM then SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bot.providers.base import InstanceStatus, LaunchRequest, NotFoundError, OfferQuery
from bot.providers.local import KILLED_EXIT_CODE, LocalProvider
from runner.contract.spec import EXIT_PREEMPTED

# A stand-in runner: prints the spec it got, checkpoints on SIGTERM and exits 75 like tunebot-runner.
FAKE_RUNNER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    spec = json.loads(os.environ["TUNEBOT_JOB_SPEC"])
    print("job", spec["job_id"], "secret-visible:", "VAST_API_KEY" in os.environ, flush=True)
    def stop(signum, frame):
        print("checkpoint saved", flush=True)
        sys.exit(75)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    time.sleep(float(os.environ.get("RUN_SECONDS", "30")))
    """
)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


@pytest.fixture
def local(tmp_path: Path) -> LocalProvider:
    provider = LocalProvider(workdir=tmp_path / "work", runner_command=[sys.executable, "-c", FAKE_RUNNER])
    yield provider
    for inst in provider.list_instances():
        provider.terminate(inst.instance_id, grace_s=0.5)


def _launch(provider: LocalProvider, job: str, **env: str):
    spec = json.dumps({"job_id": job})
    return provider.launch(
        LaunchRequest(
            job_id=job, offer=provider.offer(), image="unused", env={"TUNEBOT_JOB_SPEC": spec, **env}
        )
    )


def test_the_single_cpu_offer_has_a_visible_price(tmp_path: Path) -> None:
    provider = LocalProvider(workdir=tmp_path, price_per_hour=0.25, gpu_memory_gb=8)
    [offer] = provider.search_offers(OfferQuery())
    assert offer.gpu == "cpu" and offer.price_per_hour == 0.25 and offer.gpu_memory_gb == 8
    assert provider.search_offers(OfferQuery(gpu="rtx-4090")) == []
    assert provider.search_offers(OfferQuery(max_price_per_hour=0.1)) == []


def test_runs_the_runner_with_the_spec_and_records_the_exit_code(local: LocalProvider, monkeypatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "bot-only-secret")
    inst = _launch(local, "quick", RUN_SECONDS="0")
    wait_for(lambda: local.status(inst.instance_id).status == InstanceStatus.exited)
    done = local.status(inst.instance_id)
    assert done.exit_code == 0 and done.label == "tunebot-quick"
    log = local.log_path(inst.instance_id).read_text()
    assert "job quick" in log and "secret-visible: False" in log
    assert local.exit_code_path(inst.instance_id).read_text().strip() == "0"
    assert [i.instance_id for i in local.list_instances()] == [inst.instance_id]  # exited, not yet terminated


def test_preempt_sends_sigterm_and_the_runner_exits_75(local: LocalProvider) -> None:
    inst = _launch(local, "spot")
    wait_for(lambda: "ready" in local.log_path(inst.instance_id).read_text())
    after = local.preempt(inst.instance_id, grace_s=5.0)
    assert after.status == InstanceStatus.exited and after.exit_code == EXIT_PREEMPTED
    assert "checkpoint saved" in local.log_path(inst.instance_id).read_text()


def test_preempt_kills_after_the_grace_period(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
        "time.sleep(30)"
    )
    provider = LocalProvider(workdir=tmp_path, runner_command=[sys.executable, "-c", stubborn])
    inst = provider.launch(LaunchRequest(job_id="stubborn", offer=provider.offer(), image="x"))
    wait_for(lambda: "ready" in provider.log_path(inst.instance_id).read_text())
    started = time.monotonic()
    after = provider.preempt(inst.instance_id, grace_s=0.3)
    assert time.monotonic() - started >= 0.3  # it gave the grace period (a lower bound: load cannot flake it)
    # ... and then killed it: left alone, the process would have slept its 30 s out and exited 0
    assert after.status == InstanceStatus.exited and after.exit_code == KILLED_EXIT_CODE
    provider.terminate(inst.instance_id)


def test_a_new_provider_in_a_new_process_lists_and_terminates_instances(local: LocalProvider) -> None:
    inst = _launch(local, "survivor")
    wait_for(lambda: "ready" in local.log_path(inst.instance_id).read_text())
    # A brand-new bot process (the old one "crashed") sees the instance and terminates it.
    script = textwrap.dedent(
        f"""
        from bot.providers.local import LocalProvider
        p = LocalProvider(workdir={str(local.workdir)!r})
        found = [i for i in p.list_instances() if i.label == "tunebot-survivor"]
        assert len(found) == 1 and found[0].status.value == "running", found
        p.terminate(found[0].instance_id)
        print("terminated", found[0].instance_id)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"terminated {inst.instance_id}" in out.stdout
    assert local.status(inst.instance_id).status == InstanceStatus.terminated
    assert local.list_instances() == []


def test_the_process_outlives_its_launcher(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from bot.planner.offer import Offer
        from bot.providers.base import LaunchRequest
        from bot.providers.local import LocalProvider
        p = LocalProvider(workdir={str(tmp_path)!r}, runner_command=["sleep", "30"])
        i = p.launch(LaunchRequest(job_id="orphan", offer=p.offer(), image="x"))
        print(i.instance_id)
        import os
        os._exit(1)  # the bot crashes
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    iid = out.stdout.strip()
    provider = LocalProvider(workdir=tmp_path)
    assert provider.status(iid).status == InstanceStatus.running
    provider.terminate(iid)
    assert provider.status(iid).status == InstanceStatus.terminated
    assert provider.list_instances() == []


def test_launch_is_idempotent_by_label_and_terminate_twice_is_fine(local: LocalProvider) -> None:
    a = _launch(local, "once")
    b = _launch(local, "once")
    assert a.instance_id == b.instance_id and len(local.list_instances()) == 1
    local.terminate(a.instance_id, grace_s=0.5)
    local.terminate(a.instance_id, grace_s=0.5)
    with pytest.raises(NotFoundError):
        local.status("local-missing")
    c = _launch(local, "once")  # a terminated instance does not block a relaunch
    assert c.instance_id != a.instance_id


def test_burn_rate_counts_running_instances(local: LocalProvider) -> None:
    assert local.burn_rate() == 0
    _launch(local, "b1")
    _launch(local, "b2")
    assert local.burn_rate() == pytest.approx(0.2)


def test_state_file_lists_pid_log_and_exit_file(local: LocalProvider) -> None:
    inst = _launch(local, "state")
    state = json.loads((local.workdir / "instances.json").read_text())
    rec = state[inst.instance_id]
    assert rec["label"] == "tunebot-state" and rec["pid"] > 0 and Path(rec["log"]).exists()
    assert rec["exit_file"].endswith("exit_code") and os.path.isdir(local.instance_dir(inst.instance_id))


def test_the_runners_last_words_are_readable_after_it_exits(tmp_path: Path) -> None:
    """A runner that fails before it can report (a broken spec, an import error) is still explained."""
    script = (
        "import sys; print('error: invalid job spec: seq_len: must be >= 8', file=sys.stderr); "
        'print(\'{"status":"invalid","message":"invalid job spec: seq_len: must be >= 8"}\'); '
        "sys.exit(2)"
    )
    local = LocalProvider(workdir=tmp_path, runner_command=[sys.executable, "-c", script])
    inst = local.launch(LaunchRequest(job_id="j-words", offer=local.offer(), image="img"))
    deadline = time.monotonic() + 10
    while local.status(inst.instance_id).status != InstanceStatus.exited and time.monotonic() < deadline:
        time.sleep(0.05)
    assert local.status(inst.instance_id).exit_code == 2
    assert local.exit_message(inst.instance_id) == "invalid job spec: seq_len: must be >= 8"
    local.terminate(inst.instance_id)
