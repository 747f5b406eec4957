"""A job's log says what the run does (issue 38): on 9a0c9c1 every local job's log carried transformers'
FutureWarnings (`gradient_checkpointing_enable` and `is_gradient_checkpointing` are deprecated) and, for QLoRA
on the CPU, bitsandbytes' notices about its own kernels. The runner calls the libraries by their current names
and filters, by their exact start, the notices its libraries print about themselves (runner/quiet.py). A real
tiny run of each method, activation checkpointing on, through the runner's own entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_a_runner_log_has_no_library_deprecation_notices(tmp_path: Path, method: str) -> None:
    from runner.tiny import make_tiny

    job = make_tiny(tmp_path / "tiny", seed=0, method=method)
    spec = json.loads(job.read_text())
    spec.update(max_steps=2, gradient_checkpointing=True)
    job.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's defaults, as on a host
    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--spec", str(job)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert '"status":"finished"' in log.replace(" ", ""), log[-2000:]
    for notice in (
        "FutureWarning",
        "DeprecationWarning",
        "is deprecated",
        "gemv_4bit",
        "kernels-community",
    ):
        assert notice not in log, f"{notice}:\n{log[-3000:]}"
