"""runner/contract/ is what the bot and the runner agree on, and the bot imports it: it must stay torch-free
(the bot's process never imports torch or transformers) and import nothing of the runner outside itself."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import runner.contract

ROOT = Path(__file__).resolve().parents[2]


def test_the_contract_imports_neither_torch_nor_the_runners_training_code() -> None:
    names = sorted(m.name for m in pkgutil.iter_modules(runner.contract.__path__))
    assert {"spec", "integrity", "records", "reading", "steps", "fitting", "publish"} <= set(names)
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module('runner.contract.' + name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'peft', 'runner', 'bot'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=120
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m.split(".")[0] in ("torch", "transformers", "peft", "bot")] == []
    assert [m for m in loaded if m != "runner" and not m.startswith("runner.contract")] == []
    assert {f"runner.contract.{n}" for n in names} <= set(loaded)  # the walk imported every module
