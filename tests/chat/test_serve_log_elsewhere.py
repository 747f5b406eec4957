"""`tunebot serve`'s log tells what other processes did to the jobs (issue 38): on 9a0c9c1 it showed progress
and endings, but a launch, start or resume made from the CLI never reached it (docs/deploy.md promises a
job's milestones there): those events are published on the CLI process's own bus. Two engines on one
database stand for two processes here (each its own bus); then the real `tunebot serve` and a CLI launch."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
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
