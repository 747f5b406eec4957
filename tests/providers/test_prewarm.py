"""Prewarmed local runner starts (bot/providers/prewarm.py, runner/prewarm.py): a forked runner is the
runner a plain start gives (its environment, folder, session, exit codes, signals), a run's own values never
reach the long-lived process, and that process ends with the bot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.providers import prewarm
from bot.providers.base import InstanceStatus, LaunchRequest
from bot.providers.local import LocalProvider
from runner.contract.spec import EXIT_BAD_SPEC, EXIT_PREEMPTED

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny job (model, tokenizer and data made here), checkpoints every step."""
    out = tmp_path_factory.mktemp("tiny")
    make = [sys.executable, "-P", "-m", "runner.cli", "make-tiny", str(out), "--seed", "0"]
    subprocess.run(make, check=True, capture_output=True)
    spec = json.loads((out / "job.json").read_text())
    spec["checkpoint"] = {**spec["checkpoint"], "uri": str(out / "checkpoints"), "every_minutes": 1e-9}
    spec["output_uri"] = str(out / "output")
    return spec


@pytest.fixture(scope="module")
def pool() -> prewarm.Prewarmed:
    """One pool for the module (its process imports torch once), not the suite's own."""
    own = prewarm.Prewarmed(sys.executable)
    yield own
    own.stop()


@pytest.fixture
def local(tmp_path: Path, pool: prewarm.Prewarmed, monkeypatch: pytest.MonkeyPatch) -> LocalProvider:
    monkeypatch.setattr(prewarm, "shared", lambda python: pool)
    provider = LocalProvider(workdir=tmp_path / "work", prewarm=True)
    yield provider
    for inst in provider.list_instances():
        provider.terminate(inst.instance_id, grace_s=0.5)


def launch(local: LocalProvider, job: str, spec: dict | str, **env: str):
    text = spec if isinstance(spec, str) else json.dumps(spec)
    return local.launch(
        LaunchRequest(job_id=job, offer=local.offer(), image="unused", env={"TUNEBOT_JOB_SPEC": text, **env})
    )


def warmed(local: LocalProvider, pool: prewarm.Prewarmed) -> None:
    """Warm the provider's environment; wait until a launch would fork."""
    local.warm()
    wait_for(lambda: any(w.is_ready() for w in pool._warm.values()))


def forked(local: LocalProvider, instance_id: str) -> bool:
    return int(local._record(instance_id)["pid"]) not in local._children


def test_a_forked_runner_gets_the_launch_environment_folder_and_its_own_session(
    local: LocalProvider, pool: prewarm.Prewarmed, tiny_spec: dict
) -> None:
    warmed(local, pool)
    spec = {**tiny_spec, "max_steps": 400}
    inst = launch(local, "job-a", spec, AWS_SECRET_ACCESS_KEY="s3-secret-9f1", HF_TOKEN="hf_read_77a")
    assert forked(local, inst.instance_id)
    rec = local._record(inst.instance_id)
    runner = local._runner_pid(rec, wait_s=5.0)
    assert runner is not None and os.getpgid(runner) == os.getsid(runner) == int(rec["pid"])
    assert os.readlink(f"/proc/{runner}/cwd") == str(local.instance_dir(inst.instance_id))
    # The long-lived process holds none of the run's own values.
    (server,) = [w.proc.pid for w in pool._warm.values()]
    held = environ_of(server)
    assert not [k for k in held if k.startswith(("TUNEBOT_", "AWS_"))] and "HF_TOKEN" not in held
    # SIGTERM reaches the runner: it checkpoints and exits as preempted, recorded by its keeper.
    wait_for(lambda: "checkpoint-2" in local.log_path(inst.instance_id).read_text())
    assert "max steps: 400" in local.log_path(inst.instance_id).read_text()  # the spec it was given
    assert local.preempt(inst.instance_id, grace_s=60).exit_code == EXIT_PREEMPTED
    log = local.log_path(inst.instance_id).read_text()
    assert "checkpoint" in log and json.loads(log.strip().splitlines()[-1])["status"] == "preempted"


def test_the_runner_process_takes_the_whole_launch_environment_and_nothing_else(tmp_path: Path) -> None:
    from runner.prewarm import Start, become_runner

    start = Start(
        args=[],
        env={"TUNEBOT_JOB_SPEC": "{}", "AWS_SECRET_ACCESS_KEY": "s3-secret-9f1", "PATH": "/usr/bin"},
        cwd=str(tmp_path),
        log=str(tmp_path / "runner.log"),
        pid_file=str(tmp_path / "pid"),
        exit_file=str(tmp_path / "exit"),
    )
    os.environ["TUNEBOT_LEFT_OVER"] = "from the server"  # what the prewarmed process had is not kept
    try:
        pid = os.fork()
        if pid == 0:
            try:
                become_runner(start, os.open(start.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
                os.write(1, json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}).encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    finally:
        del os.environ["TUNEBOT_LEFT_OVER"]
    seen = json.loads((tmp_path / "runner.log").read_text())
    assert seen == {"env": start.env, "cwd": str(tmp_path)}


def test_a_forked_runner_ends_as_a_plain_one_does(
    local: LocalProvider, pool: prewarm.Prewarmed, tmp_path: Path
) -> None:
    plain = LocalProvider(workdir=tmp_path / "plain", prewarm=False)
    warmed(local, pool)
    ends = {}
    for name, provider in (("plain", plain), ("forked", local)):
        inst = launch(provider, f"bad-{name}", {"job_id": "x", "base_model": 3})
        wait_for(lambda p=provider, i=inst.instance_id: p.status(i).status == InstanceStatus.exited)
        summary = json.loads(provider.log_path(inst.instance_id).read_text().strip().splitlines()[-1])
        ends[name] = (provider.status(inst.instance_id).exit_code, summary["status"], summary["message"][:60])
    assert forked(local, inst.instance_id)
    assert ends["forked"] == ends["plain"] and ends["plain"][0] == EXIT_BAD_SPEC
    # A runner killed by a signal is recorded as sh records it: 128 + the signal.
    inst = launch(local, "killed", {"job_id": "x", "base_model": 3})
    os.kill(local._runner_pid(local._record(inst.instance_id), wait_s=5.0), signal.SIGKILL)
    wait_for(lambda: local.status(inst.instance_id).status == InstanceStatus.exited)
    assert local.status(inst.instance_id).exit_code in (128 + signal.SIGKILL, EXIT_BAD_SPEC)


def test_a_process_that_launches_once_starts_no_prewarmed_process(tmp_path: Path) -> None:
    own = prewarm.Prewarmed(sys.executable)
    env = {**prewarm.import_env(os.environ), "TUNEBOT_JOB_SPEC": "{}"}
    files = {
        "cwd": tmp_path,
        "log_file": tmp_path / "log",
        "pid_file": tmp_path / "p",
        "exit_file": tmp_path / "e",
    }
    try:
        assert own.start(args=[], env=env, **files) is None and not own._warm  # a CLI command's one launch
        assert own.start(args=[], env=env, **files) is None and len(own._warm) == 1  # a second: it warms
    finally:
        own.stop()
    assert not own._warm


def test_another_import_environment_gets_its_own_process(pool: prewarm.Prewarmed) -> None:
    base = prewarm.import_env(os.environ)
    pool.warm({**base, "HF_ENDPOINT": "http://127.0.0.1:1"})
    pool.warm({**base, "HF_ENDPOINT": "http://127.0.0.1:2"})
    endpoints = sorted(environ_of(w.proc.pid).get("HF_ENDPOINT", "") for w in pool._warm.values())
    assert endpoints == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert prewarm.import_env({"TUNEBOT_JOB_KEY": "k", "AWS_SESSION_TOKEN": "t", "WANDB_API_KEY": "w"}) == {}


def test_the_prewarmed_process_ends_with_the_bot(tmp_path: Path) -> None:
    bot = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "from bot.providers.prewarm import Prewarmed, import_env\n"
            "pool = Prewarmed(sys.executable)\n"
            "pool.warm(os.environ)\n"
            "print(next(iter(pool._warm.values())).proc.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert bot.stdout is not None
    server = int(bot.stdout.readline())
    os.kill(server, 0)
    bot.kill()  # no atexit, no cleanup: only the closed pipe tells it
    bot.wait()

    def gone() -> bool:
        try:
            state = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return True
        return state in ("Z", "X")

    wait_for(gone, timeout=60)


def test_a_request_without_a_line_in_bounds_is_refused_and_the_process_serves_on(
    local: LocalProvider, pool: prewarm.Prewarmed
) -> None:
    import socket

    from runner.prewarm import MAX_REQUEST_BYTES

    warmed(local, pool)
    warm = next(w for w in pool._warm.values() if w.is_ready())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        conn.connect(warm.socket_path)
        conn.sendall(b"x" * (MAX_REQUEST_BYTES + 1))
        answer = json.loads(conn.makefile("rb").readline())
    assert "error" in answer and "pid" not in answer
    assert warm.proc.poll() is None  # still serving
