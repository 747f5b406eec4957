"""scripts/install.sh says nothing alarming (issue 38): on 9a0c9c1 a fresh install printed "Failed to
initialize NumPy: No module named 'numpy'", because the script imported torch to pin its version before the
extras (numpy among them) were installed. The script is run here for real in a copy of its folder, on a fresh
venv whose torch is a stand-in that says what the real one says when imported without numpy; nothing is
downloaded (pip has no index, and the extras' install is a recording stand-in)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = """\
import sys, warnings
try:
    import numpy  # noqa: F401
except ImportError as exc:  # what torch says when imported before numpy is installed
    warnings.warn(f"Failed to initialize NumPy: {exc}", UserWarning)
print("torch was imported", file=sys.stderr)
__version__ = "2.13.0+cpu"
"""
PIP = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/../pip-calls.txt"
"""


def test_the_install_pins_torch_without_importing_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", repo / "scripts" / "install.sh")
    venv.EnvBuilder(with_pip=True).create(repo / ".venv")
    site = next((repo / ".venv" / "lib").glob("python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(TORCH)
    dist = site / "torch-2.13.0+cpu.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    pip = repo / ".venv" / "bin" / "pip"
    pip.unlink()
    pip.write_text(PIP)
    pip.chmod(0o755)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/install.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Failed to initialize NumPy" not in out and "torch was imported" not in out, out[-3000:]
    assert (repo / ".venv" / "torch-constraint.txt").read_text().strip() == "torch==2.13.0+cpu"
    calls = (repo / ".venv" / "pip-calls.txt").read_text()
    assert "-c .venv/torch-constraint.txt -e .[runner,dev]" in calls, calls  # the extras, torch pinned
    assert "install -q torch" not in calls, calls  # torch was there: not installed again
