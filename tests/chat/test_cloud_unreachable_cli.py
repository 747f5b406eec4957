"""`tunebot launch` when the cloud's API is a real closed port on 127.0.0.1 (issue 27: 69 s, the same error
about 18 times on one line, the job `recovering` with no end).

The command answers (the job is created and waits, saying why once and what to do), `tunebot gpus --live`
says the cloud did not answer once, and `tunebot stop` ends the waiting job at once: nothing was rented.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_on_an_unreachable_cloud_says_so_once_and_waits_with_a_next_step(
    tmp_path: Path,
    s3_bucket: str,  # noqa: F811
) -> None:
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    env = {
        **os.environ,
        "TUNEBOT_DATA_DIR": str(tmp_path / "data"),
        "COLUMNS": "200",
        "VAST_API_KEY": "vast-test-key",
        "VAST_API_URL": f"http://127.0.0.1:{closed_port()}",
        "TUNEBOT_CHECKPOINT_URI": f"{s3_bucket}/tunebot",
        "TUNEBOT_MIN_RELIABILITY": "0",
        "TUNEBOT_LOCAL_PROVIDER": "0",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", "from bot.cli import main; main()", *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
        return done

    gpus = cli("gpus", "--live")
    assert gpus.returncode == 0, gpus.stderr[-2000:]
    assert (gpus.stdout + gpus.stderr).count("connection failed") <= 1, gpus.stdout[-3000:]
    launched = cli("launch", str(tiny / "model"), f"dataset={tiny / 'data.jsonl'}", "steps=2", "gpu=rtx-4090")
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    (job,) = json.loads(cli("jobs", "--json").stdout)
    assert job["state"] == "recovering", job
    message = job["message"] or ""
    assert message.startswith("cloud unreachable:") and message.count("connection failed") == 1, message
    assert "Next:" in message and f"`stop {job['job_id']}`" in message
    assert launched.stdout.count("connection failed") == 1, launched.stdout[-3000:]
    stopped = cli("stop", job["job_id"])
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    (job,) = json.loads(cli("jobs", "--json").stdout)
    assert job["state"] in ("stopped", "cancelled") and job["spend"] == 0, job
