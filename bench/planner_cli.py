"""`tunebot estimate` as a whole process: median wall time vs 1.5 s, and `import bot.cli` without torch.

Usage: .venv/bin/python bench/planner_cli.py
Baseline in the same run: a bare `python -c pass` start, so the ratio shows what tunebot adds.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

TARGET_S = 1.5
REPEATS = 7
HEAVY = ("torch", "transformers", "sqlalchemy", "slack_bolt", "matplotlib")


def wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed: {proc.stderr}")
    return time.perf_counter() - t0


def main() -> None:
    env = dict(os.environ, TUNEBOT_HF_OFFLINE="1")
    exe = shutil.which("tunebot", path=os.path.dirname(sys.executable)) or shutil.which("tunebot")
    cmd = (
        [exe, "estimate", "meta-llama/Llama-3.1-8B", "--tokens", "1000000"]
        if exe
        else [sys.executable, "-m", "bot.cli", "estimate", "meta-llama/Llama-3.1-8B", "--tokens", "1000000"]
    )
    wall(cmd, env)  # warm the page cache
    runs = [wall(cmd, env) for _ in range(REPEATS)]
    bare = statistics.median(wall([sys.executable, "-c", "pass"], env) for _ in range(REPEATS))
    med = statistics.median(runs)
    print(f"command: {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}")
    print(
        f"whole process, median of {REPEATS}: {med:.2f} s (min {min(runs):.2f}, max {max(runs):.2f}); "
        f"target < {TARGET_S} s: {'OK' if med < TARGET_S else 'MISSED'}"
    )
    print(f"baseline bare interpreter start: {bare:.2f} s; tunebot adds {med - bare:.2f} s")
    code = f"import sys, bot.cli; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    ).stdout.strip()
    print(
        f"import bot.cli loads: {loaded or 'none of ' + ', '.join(HEAVY)}  "
        f"(torch imported: {'YES' if 'torch' in loaded.split(',') else 'no'})"
    )


if __name__ == "__main__":
    main()
