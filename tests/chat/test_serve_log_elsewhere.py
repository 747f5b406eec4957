"""`tunebot serve`'s log tells what other processes did to the jobs (issue 38): on 9a0c9c1 it showed progress
and endings, but a launch, start or resume made from the CLI never reached it (docs/deploy.md promises a
job's milestones there): those events are published on the CLI process's own bus. Two engines on one
database stand for two processes here (each its own bus); then the real `tunebot serve` and a CLI launch."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from engine.conftest import db_url, pg_database  # noqa: F401  (the fixtures: SQLite and PostgreSQL)
from engine.test_supervisor_everywhere import serving  # noqa: F401  (the fixture: `tunebot serve`, no Slack)
from rich.console import Console

from bot.chat.console import ElsewhereWatcher


def test_changes_made_by_another_process_are_told_once_and_its_own_not_twice(tmp_path: Path) -> None:
    from engine.conftest import estimate_for, request
    from engine.fakes import FakeProvider

    from bot.engine.service import Engine
    from bot.settings import Settings

    fake = FakeProvider("fake")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    serve, cli = (Engine(settings, db_url=url, providers={"fake": fake}) for _ in range(2))
    now = [0.0]
    out = io.StringIO()
    watcher = ElsewhereWatcher(
        serve, Console(file=out, width=300, color_system=None), clock=lambda: now[0]
    ).attach(serve.bus)

    def told() -> list[str]:  # two reads a few seconds apart: a change is told once it has settled
        first = watcher.poll()
        now[0] += 3.0
        return first + watcher.poll()

    try:
        assert told() == []  # what was there before is not news
        job = cli.create_job(request(), user="alice", estimate=estimate_for(fake), max_cost=5.0)
        (line,) = told()
        assert f"Job {job.job_id} of alice launched by another process on fake" in line, line
        assert "at $1.00/h: running" in line, line
        assert told() == []  # told once
        cli.stop(job.job_id, user="alice")
        (line,) = told()
        assert f"Job {job.job_id} of alice ended by another process: stopped" in line, line
        cli.resume(job.job_id, user="alice")
        (line,) = told()
        assert f"Job {job.job_id} of alice resumed by another process" in line, line
        serve.stop(job.job_id, user="alice")  # this process's own: its bus said it (the log notifier's line)
        assert told() == []
        assert out.getvalue().count(f"[{job.job_id}]") == 3, out.getvalue()
    finally:
        serve.close()
        cli.close()


def _two_processes(tmp_path: Path, url: str):  # noqa: ANN202
    """`tunebot serve` and a CLI as two engines on one database (``url``), the watcher on serve's bus;
    ``told()``: two reads a settle apart, what they told."""
    from engine.fakes import FakeProvider

    from bot.engine.service import Engine
    from bot.settings import Settings

    fake = FakeProvider("fake")
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    serve, cli = (Engine(settings, db_url=url, providers={"fake": fake}) for _ in range(2))
    now = [0.0]
    out = io.StringIO()
    watcher = ElsewhereWatcher(serve, Console(file=out, width=300, color_system=None), clock=lambda: now[0])

    def told() -> list[str]:
        first = watcher.poll()
        now[0] += 3.0
        return first + watcher.poll()

    return fake, serve, cli, watcher.attach(serve.bus), told, out


def _finish(engine, fake, job_id: str) -> None:  # noqa: ANN001
    """The job's runner says it finished (signed, as a run sends it); the engine ends the job."""
    from engine.test_monitor import _sev, _token
    from fakes.worlds import join_finisher

    from runner.contract.spec import JobSpec

    spec = JobSpec.model_validate_json(fake.launch_requests[-1].env["TUNEBOT_JOB_SPEC"])
    event = _sev(engine, job_id, 1, "finished", output_uri=spec.output_uri + "/adapter")
    assert engine.record_runner_event(job_id, _token(fake), event)
    engine.tick()
    join_finisher(job_id)
    assert engine.get_job(job_id).state == "succeeded"


def test_a_job_launched_and_finished_elsewhere_between_two_reads_is_told(tmp_path: Path, db_url: str) -> None:  # noqa: F811
    """Issue 38: the active jobs were read, so a CLI job that launched and ended between two reads was never
    in them, and its launch and its end were never told."""
    from engine.conftest import estimate_for, request

    fake, serve, cli, watcher, told, out = _two_processes(tmp_path, db_url)
    try:
        assert told() == []
        job = cli.create_job(request(), user="alice", estimate=estimate_for(fake), max_cost=5.0)
        _finish(cli, fake, job.job_id)
        (line,) = told()
        assert f"Job {job.job_id} of alice launched by another process on fake" in line, line
        assert "and ended: succeeded" in line, line
        assert told() == []  # told once
        mine = serve.create_job(request(), user="bob", estimate=estimate_for(fake), max_cost=5.0)
        _finish(serve, fake, mine.job_id)  # this process's own: its bus said it
        assert told() == []
        assert f"[{mine.job_id}]" not in out.getvalue(), out.getvalue()
    finally:
        serve.close()
        cli.close()


def test_a_resume_of_a_job_that_ended_before_serve_started_is_told_as_a_resume(
    tmp_path: Path,
    db_url: str,  # noqa: F811
) -> None:
    """Issue 38: a job that ended before the watcher's first read was not known to it, so its resume read as
    a new active job: "launched"."""
    from engine.conftest import estimate_for, request

    fake, serve, cli, watcher, told, out = _two_processes(tmp_path, db_url)
    try:
        job = cli.create_job(request(), user="alice", estimate=estimate_for(fake), max_cost=5.0)
        cli.stop(job.job_id, user="alice")
        assert told() == []  # serve starts: what was there before is not news
        cli.resume(job.job_id, user="alice")
        (line,) = told()
        assert f"Job {job.job_id} of alice resumed by another process" in line, line
        cli.stop(job.job_id, user="alice")
        (line,) = told()
        assert f"Job {job.job_id} of alice ended by another process: stopped" in line, line
        cli.resume(job.job_id, user="alice")  # resumed and stopped again between two reads
        cli.stop(job.job_id, user="alice")
        (line,) = told()
        assert f"Job {job.job_id} of alice resumed by another process on fake" in line, line
        assert "and ended: stopped" in line, line
        serve.resume(job.job_id, user="alice")  # this process's own resume and stop: its bus said them
        serve.stop(job.job_id, user="alice")
        assert told() == []
        assert out.getvalue().count(f"[{job.job_id}]") == 3, out.getvalue()
    finally:
        serve.close()
        cli.close()


@pytest.mark.slow
def test_the_serve_log_tells_a_cli_launch_and_its_start(tmp_path: Path, serving) -> None:  # noqa: ANN001, F811
    from engine.test_supervisor_everywhere import _cli, _lease, _tiny_launch, _wait, _wait_logged

    data_dir = tmp_path / "data"
    serve = serving(data_dir)
    serve.wait_healthy()
    _wait(lambda: _lease(data_dir), 120, "the lease", serve.output)
    done = _cli(data_dir, *_tiny_launch(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = " ".join(done.stdout.split()).split("Job ", 1)[1].split(":", 1)[0]
    _wait_logged(f"Job {job_id} of operator launched by another process on local cpu x1", serve.output)
    _wait_logged(f"[{job_id}] ✓ Finished at step 20", serve.output)
