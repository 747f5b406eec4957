"""A bot-only install says nothing it should not (issue 38): on 9a0c9c1 every estimate that read a model's
tokenizer printed transformers' "[transformers] PyTorch was not found. Models won't be available ..." where
torch is not installed, which is how the bot is meant to run (it never imports torch). Here torch is hidden
from a real `tunebot estimate` process (as if not installed): the estimate still counts with the model's
tokenizer, and that line is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

NO_TORCH = 'import sys; sys.modules["torch"] = None; from bot.cli import main; main()'  # find_spec: None


def test_a_bot_only_estimate_prints_no_pytorch_advice(tmp_path: Path) -> None:
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny", seed=0).parent
    env = {**os.environ, "TUNEBOT_DATA_DIR": str(tmp_path / "data")}
    words = ["estimate", str(tiny / "model"), f"dataset={tiny / 'data.jsonl'}", "--json"]
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH, *words], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch is not installed" in proc.stderr  # torch was hidden indeed: the local provider says so
    assert "PyTorch was not found" not in proc.stderr, proc.stderr
    estimate = json.loads(proc.stdout)
    assert "runner's tokenizer" in json.dumps(estimate["assumptions"]), estimate["assumptions"]
