"""What docs/deploy.md and README promise about running `tunebot serve` holds (issue 27).

No Docker engine here: `Dockerfile.bot` is checked as text (as tests/runner/test_dockerfile.py checks the
runner's). On eac3cff the bot's Dockerfile existed only in the docs, declared `TUNEBOT_DATA_DIR=/data` and ran
as a user that could not write there; the docs did not say from which directory `.env` is read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _steps(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_bot_image_can_write_its_data_folder() -> None:
    steps = _steps((ROOT / "Dockerfile.bot").read_text())
    (user,) = [rest for word, rest in steps if word == "USER"]
    assert user not in ("root", "0")
    data = next(rest for word, rest in steps if word == "ENV" and rest.startswith("TUNEBOT_DATA_DIR="))
    folder = data.split("=", 1)[1]
    switch = next(i for i, (word, _) in enumerate(steps) if word == "USER")
    before = " ".join(rest for word, rest in steps[:switch] if word == "RUN")
    # Made, and given to that user, before the switch: a named volume mounted there starts as a copy of it.
    assert f"mkdir -p {folder}" in before and f"chown {user}:{user} {folder}" in before, before
    assert ("VOLUME", folder) in steps[switch:]
    assert ("WORKDIR", folder) in steps  # .env is read from the working directory: the data folder
    cmd = next(rest for word, rest in steps if word == "CMD")
    assert '"tunebot", "serve"' in cmd
    # The deployment guide shows this very file.
    assert (ROOT / "Dockerfile.bot").read_text() in (ROOT / "docs" / "deploy.md").read_text()


def test_the_docs_say_where_dotenv_is_read_and_it_is_read_there(tmp_path: Path) -> None:
    readme = " ".join((ROOT / "docs" / "configuration.md").read_text().split())
    assert "`.env` file in the **current working directory**" in readme
    deploy = " ".join((ROOT / "docs" / "deploy.md").read_text().split())
    assert "a `.env` file in the working directory" in deploy
    assert "WorkingDirectory=/var/lib/tunebot" in deploy
    here = tmp_path / "project"
    here.mkdir()
    (here / ".env").write_text(f"TUNEBOT_DATA_DIR={tmp_path / 'from-dotenv'}\n")
    env = {k: v for k, v in os.environ.items() if k != "TUNEBOT_DATA_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    code = "from bot.settings import Settings; print(Settings().data_dir)"
    shown = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True)
    assert shown.stdout.strip() == str(tmp_path / "from-dotenv"), shown.stderr
    env["TUNEBOT_DATA_DIR"] = str(tmp_path / "from-env")  # the environment wins over the file
    shown = subprocess.run([sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True)
    assert shown.stdout.strip() == str(tmp_path / "from-env"), shown.stderr


def test_the_deploy_guide_runs_serve_under_systemd_with_or_without_slack() -> None:
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "ExecStart=/opt/tunebot/.venv/bin/tunebot serve" in deploy
    assert "## The CLI only (no Slack)" in deploy and "tunebot serve &" in deploy
    assert "TUNEBOT_START_SUPERVISOR=0" in deploy and "exit 79" in deploy
