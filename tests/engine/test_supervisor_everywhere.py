"""A supervisor in every deployment (issue 27, item 1).

On eac3cff `tunebot serve` without Slack tokens exited 2 (or opened the console), yet every CLI launch ended
with "Run tunebot serve": a team on the CLI, or whose Slack app was down, had no supervisor at all. A job with
max_cost=$0.02 reached $0.03 and billed on after it ended; a runner that was killed stayed `running` until
someone typed `tunebot reconcile`. Here, with no Slack variable anywhere:

- `tunebot serve` stays up and answers /healthz (a real process, real HTTP), and writes what would go to a
  job's thread to its log (no APScheduler line every 10 s, no chart folder left in the temp directory);
- a job over its cap (the real runner on the local provider) is stopped and torn down by that process alone;
- a runner killed under it does not stay `running`: the supervisor sees the instance end;
- a CLI launch says who supervises its job: a live `tunebot serve`, or one it starts in the background when
  none is alive (two started at once: the scheduler's lease keeps one).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.serve_process import free_port

ROOT = Path(__file__).resolve().parents[2]


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    """This test's environment: no Slack, no cloud key, no database URL (SQLite in the data folder)."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TUNEBOT_", "SLACK_", "DATABASE_", "COLUMNS"))
    }
    return {
        **base,
        "PYTHONPATH": str(ROOT),
        "TUNEBOT_DATA_DIR": str(data_dir),
        "TUNEBOT_START_SUPERVISOR": "0",
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
        **extra,
    }


class Serve:
    """`tunebot serve` with no Slack variable, as a child process (a TMPDIR of its own: what it leaves)."""

    def __init__(self, tmp: Path, data_dir: Path, *args: str, **env: str) -> None:
        self.port = free_port()
        self.tmpdir = tmp / "serve-tmp"
        self.tmpdir.mkdir(exist_ok=True)
        self.log = tmp / f"serve-{self.port}.log"
        self.env = _env(data_dir, TMPDIR=str(self.tmpdir), **env)
        self.args = ["serve", "--port", str(self.port), *args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Serve:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bot.cli", *self.args],
                env=self.env,
                cwd=self.tmpdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def healthz(self) -> dict[str, Any] | None:
        try:
            answer = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
        except httpx.HTTPError:
            return None
        return answer.json() if answer.status_code == 200 else None

    def wait_healthy(self, timeout: float = 240) -> dict[str, Any]:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode}:\n{self.output()}"
            if (health := self.healthz()) is not None:
                return health
            time.sleep(0.5)
        raise AssertionError(f"serve did not answer /healthz:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    made: list[Serve] = []

    def make(data_dir: Path, *args: str, **env: str) -> Serve:
        serve = Serve(tmp_path, data_dir, *args, **env).start()
        made.append(serve)
        return serve

    yield make
    for serve in made:
        serve.stop()


def _wait(cond: Callable[[], Any], timeout: float, what: str, log: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}\n{log()[-6000:]}")


def _wait_logged(line: str, log: Callable[[], str]) -> None:
    """What the job's thread would have been told is written to the supervisor's log after the final state
    commits: a test that saw the state waits for the line (a loaded machine read the log in between)."""
    _wait(lambda: line in log(), 60, f"{line!r} in the supervisor's log", log)


def _job_row(data_dir: Path, job_id: str) -> dict[str, Any]:
    with sqlite3.connect(data_dir / "tunebot.db") as db:
        db.row_factory = sqlite3.Row
        row = db.execute("select * from jobs where id = ?", (job_id,)).fetchone()
        return dict(row) if row else {}


def _ticks_done(data_dir: Path) -> list[dict[str, Any]]:
    """The scheduler's tick runs that have finished (store.models.TaskRun rows, one per period)."""
    try:
        with sqlite3.connect(data_dir / "tunebot.db") as db:
            db.row_factory = sqlite3.Row
            rows = db.execute("select * from task_runs where task = 'tick' and finished_at is not null")
            return [dict(r) for r in rows]
    except sqlite3.OperationalError:  # busy: the supervisor is writing
        return []


def _instances(data_dir: Path, job_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(data_dir / "tunebot.db") as db:
        db.row_factory = sqlite3.Row
        return [
            dict(r) for r in db.execute("select * from instances where job_id = ? order by id", (job_id,))
        ]


def _local_job(tmp_path: Path, data_dir: Path, *, max_cost: float, steps: int, hours: float) -> str:
    """A job on the local provider (the real runner), created the way a CLI process creates one and left to
    whatever supervises the database: this process keeps no engine open."""
    from bot.engine.service import Engine
    from bot.planner.request import EstimateRequest
    from bot.providers.local import LocalProvider
    from bot.settings import Settings
    from runner.tiny import make_tiny

    from .fakes import make_estimate

    tiny = make_tiny(tmp_path / "tiny").parent
    local = LocalProvider(workdir=data_dir / "local-provider", price_per_hour=0.10)
    eng = Engine(Settings(TUNEBOT_DATA_DIR=str(data_dir)), providers={"local": local})
    try:
        req = EstimateRequest(
            model=str(tiny / "model"),
            dataset=str(tiny / "data.jsonl"),
            method="lora",
            seq_len=64,
            batch_size=1,
            grad_accum=1,
            gradient_checkpointing=False,
        )
        overrides = {"max_steps": steps, "plateau": {"enabled": False}, "report": {"every_seconds": 1.0}}
        job = eng.create_job(
            req,
            user="alice",
            estimate=make_estimate([local.offer()], hours=hours),
            max_cost=max_cost,
            spec_overrides=overrides,
        )
        assert job.state == "running", job.message
        return job.job_id
    finally:
        eng.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


@pytest.mark.slow
def test_serve_with_no_slack_variables_stays_up_and_answers_healthz(tmp_path: Path, serving) -> None:  # noqa: ANN001
    serve = serving(tmp_path / "data")
    health = serve.wait_healthy()
    assert health == {"ok": True, "slack": False, "engine": True}
    _wait(lambda: "is now the leader" in serve.output(), 120, "the scheduler's lead", serve.output)
    ticks = _wait(lambda: _ticks_done(tmp_path / "data"), 120, "a tick of the scheduler to end", serve.output)
    assert ticks[0]["ok"], ticks  # no job to supervise, nothing to fail on
    assert serve.proc is not None and serve.proc.poll() is None, serve.output()  # still up: no exit 2
    assert serve.healthz() == health
    out = serve.output()
    assert "Slack is not configured: tunebot serve runs the supervisor alone" in out
    assert "Start the console" not in out and "Traceback" not in out
    assert "apscheduler" not in out  # no INFO line per task run ("Running job ... executed successfully")
    assert serve.stop() == 0
    assert list(serve.tmpdir.glob("tunebot-charts-*")) == []


@pytest.mark.slow
def test_a_job_over_its_cap_is_stopped_and_torn_down_with_no_slack(tmp_path: Path, serving) -> None:  # noqa: ANN001
    data_dir = tmp_path / "data"
    # $0.0003 at $0.10/h is 11 s of billing: reached while the runner is still starting on this machine.
    job_id = _local_job(tmp_path, data_dir, max_cost=0.0003, steps=100_000, hours=0.0001)
    (row,) = _instances(data_dir, job_id)
    serve = serving(data_dir)
    serve.wait_healthy()

    def ended() -> bool:
        return _job_row(data_dir, job_id).get("state") in ("stopped", "failed", "succeeded")

    _wait(ended, 600, "the job to end at its cap", serve.output)
    job = _job_row(data_dir, job_id)
    assert job["state"] == "stopped" and job["stop_reason"] == "budget", job
    (inst,) = _instances(data_dir, job_id)
    assert inst["ended_at"] is not None  # torn down: confirmed gone at the provider
    state = json.loads((data_dir / "local-provider" / "instances.json").read_text())
    assert state[row["provider_instance_id"]]["terminated"] is True
    assert not _alive(state[row["provider_instance_id"]]["pid"])
    _wait_logged(f"Job {job_id} stopped (budget)", serve.output)  # what would have gone to the job's thread
    assert "apscheduler" not in serve.output()


@pytest.mark.slow
def test_a_killed_runner_does_not_stay_running_without_slack(tmp_path: Path, serving) -> None:  # noqa: ANN001
    data_dir = tmp_path / "data"
    job_id = _local_job(tmp_path, data_dir, max_cost=5.0, steps=100_000, hours=0.5)
    (row,) = _instances(data_dir, job_id)
    serve = serving(data_dir)
    serve.wait_healthy()
    pid_file = data_dir / "local-provider" / "instances" / row["provider_instance_id"] / "runner.pid"
    runner = int(_wait(lambda: pid_file.exists() and pid_file.read_text().strip(), 120, "the runner's pid"))
    os.kill(runner, signal.SIGKILL)  # a crash: no event, no checkpoint, nothing said
    try:

        def noticed() -> bool:
            first = _instances(data_dir, job_id)[0]
            return first["ended_at"] is not None

        _wait(noticed, 300, "the supervisor to notice the killed runner", serve.output)
        first = _instances(data_dir, job_id)[0]
        assert first["exit_code"] == 137 or first["end_reason"] in ("preempted", "failed"), first

        def moved_on() -> bool:  # the lost instance closes first, then the job moves (mark_preempted)
            job = _job_row(data_dir, job_id)
            return job["state"] != "running" or job["preemptions"] >= 1

        _wait(moved_on, 120, "the job to be relaunched or ended: not stuck running", serve.output)
    finally:
        stop = subprocess.run(
            [sys.executable, "-m", "bot.cli", "stop", job_id, "--user", "alice"],
            env=_env(data_dir),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert stop.returncode == 0, stop.stderr[-2000:]
        _wait(lambda: _job_row(data_dir, job_id)["state"] in ("stopped", "failed"), 300, "the stop")


# ---- a CLI launch and its supervisor --------------------------------------------------------------------


def _cli(data_dir: Path, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        env=_env(data_dir, **env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _tiny_launch(tmp_path: Path) -> list[str]:
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    return [
        "launch",
        str(tiny / "model"),
        f"dataset={tiny / 'data.jsonl'}",
        "steps=20",
        "seq=64",
        "max_cost=$1",
    ]


def _lease(data_dir: Path) -> tuple[str, float] | None:
    with sqlite3.connect(data_dir / "tunebot.db") as db:
        row = db.execute("select holder, expires_at from scheduler_lease where name = 'scheduler'").fetchone()
    return (row[0], row[1]) if row and row[1] > time.time() else None


@pytest.mark.slow
def test_a_cli_launch_names_the_live_supervisor(tmp_path: Path, serving) -> None:  # noqa: ANN001
    data_dir = tmp_path / "data"
    serve = serving(data_dir)
    serve.wait_healthy()
    _wait(lambda: _lease(data_dir), 120, "the lease", serve.output)
    done = _cli(data_dir, *_tiny_launch(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    assert "Supervisor: the tunebot serve alive on this job database" in out, out[-3000:]
    assert "No tunebot supervisor" not in out
    job_id = out.split("Job ", 1)[1].split(":", 1)[0]
    # It supervises the job: its runner finishes, the supervisor ends the job and terminates the instance.
    _wait(lambda: _job_row(data_dir, job_id)["state"] == "succeeded", 600, "the finish", serve.output)
    assert _instances(data_dir, job_id)[0]["ended_at"] is not None
    _wait_logged(f"[{job_id}] ✓ Finished at step 20", serve.output)  # what the job's thread would have said


@pytest.mark.slow
def test_a_cli_launch_with_no_supervisor_starts_one_in_the_background(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    done = _cli(data_dir, *_tiny_launch(tmp_path), TUNEBOT_START_SUPERVISOR="1")
    assert done.returncode == 0, done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    assert "Supervisor: none was alive on this job database, so one was started in the background" in out
    pid = int(out.split("(tunebot serve --auto, pid ", 1)[1].split(",", 1)[0])
    log = data_dir / "supervisor.log"
    try:
        assert _alive(pid) and _lease(data_dir) is not None
        job_id = out.split("Job ", 1)[1].split(":", 1)[0]
        _wait(lambda: _job_row(data_dir, job_id)["state"] == "succeeded", 600, "the finish", log.read_text)
        assert _instances(data_dir, job_id)[0]["ended_at"] is not None  # torn down by the background one
        _wait_logged(f"[{job_id}] ✓ Finished at step 20", log.read_text)
        # A second launch finds it alive instead of starting another.
        again = _cli(data_dir, *_tiny_launch(tmp_path), TUNEBOT_START_SUPERVISOR="1")
        assert "Supervisor: the tunebot serve alive on this job database" in " ".join(again.stdout.split())
    finally:
        os.kill(pid, signal.SIGTERM)
        _wait(lambda: not _alive(pid), 120, "the background supervisor to stop")


@pytest.mark.slow
def test_two_background_supervisors_started_at_once_leave_one(tmp_path: Path) -> None:
    """Two CLI commands that find no supervisor start one each at the same moment: the scheduler's lease
    picks one leader, and the other `serve --auto` leaves."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--auto", "--port", str(free_port())],
            env=_env(data_dir),
            stdin=subprocess.DEVNULL,
            stdout=(tmp_path / f"auto-{i}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    try:
        logs = lambda: "\n".join((tmp_path / f"auto-{i}.log").read_text() for i in range(2))  # noqa: E731
        _wait(lambda: any(p.poll() is not None for p in procs), 300, "one of them to leave", logs)
        (left,) = [p for p in procs if p.poll() is not None]
        (stays,) = [p for p in procs if p.poll() is None]
        assert left.returncode == 0
        assert "another supervisor leads" in logs()
        holder = _lease(data_dir)
        assert holder is not None and holder[0].startswith(f"{stays.pid}-")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(60)


@pytest.mark.slow
def test_a_background_supervisor_leaves_when_no_job_is_active(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve", "--auto", "--auto-idle", "3", "--port", str(free_port())],
        env=_env(data_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "no active job for 3 s: this supervisor leaves" in out
    assert _lease(data_dir) is None  # it cleared its lease on the way out
