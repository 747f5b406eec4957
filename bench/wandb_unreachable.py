"""What an unreachable or silent W&B server costs a run's start, against an offline start.

Each start is `WandbLog.start` in a fresh process (wandb keeps global state and starts a service process),
timed inside it around `start` alone, on the tiny job (runner/tiny.py) with W&B in the spec's online mode:
  offline      WANDB_MODE=offline in the environment: no network at all (the baseline)
  unreachable  WANDB_BASE_URL is a closed loopback port (wandb.init alone used to block ~93 s here)
  silent       WANDB_BASE_URL takes the connection and never answers (cut at the 3 s init timeout)
Rounds alternate the three so that machine load hits each alike. Prints the median of each and its
difference from and ratio to the offline start. Targets: unreachable - offline < 2 s; silent - offline
< 6 s (its 3 s init timeout, then wandb's service stopped for the offline run).
tests/runner/test_wandb.py checks the mechanism (one probe, which timeouts, how many attempts), not these.
Run: .venv/bin/python bench/wandb_unreachable.py [--rounds 3]   (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAKE_KEY = "0123456789abcdef" * 2 + "01234567"  # 40 characters, the shape of a W&B key
TARGETS = {"unreachable": 2.0, "silent": 6.0}  # seconds more than the offline start

_START = """
import json, sys, time
from runner.contract.spec import JobSpec
from runner.wandb_log import WandbLog
spec = JobSpec.model_validate_json(open(sys.argv[1]).read())
log = WandbLog()
t = time.monotonic()
log.start(spec, None, {"lr": 1e-3})
elapsed = time.monotonic() - t
log.finish()
print(json.dumps({"elapsed": elapsed, "mode": log.mode, "note": log.note}))
"""


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(spec_path: Path, workdir: Path, env: dict[str, str]) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, "WANDB_DIR": str(workdir), "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT), **env}
    if "WANDB_MODE" not in env:
        full.pop("WANDB_MODE", None)
    proc = subprocess.run(
        [sys.executable, "-c", _START, str(spec_path)],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=workdir,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from runner.tiny import make_tiny

    with tempfile.TemporaryDirectory(prefix="bench-wandb-") as tmp:
        root = Path(tmp)
        make_tiny(root / "tiny", seed=0)
        spec = json.loads((root / "tiny" / "job.json").read_text())
        spec["checkpoint"]["uri"] = str(root / "checkpoints")
        spec["output_uri"] = str(root / "output")
        spec["wandb"] = {**spec.get("wandb", {}), "mode": "online", "project": "p", "run_id": "bench"}
        spec_path = root / "job.json"
        spec_path.write_text(json.dumps(spec))
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes the handshakes; nothing ever reads or answers
        cases = {
            "offline": {"WANDB_MODE": "offline", "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"},
            "unreachable": {"WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}"},
            "silent": {"WANDB_BASE_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"},
        }
        seconds: dict[str, list[float]] = {name: [] for name in cases}
        try:
            for r in range(args.rounds):
                for name, env in cases.items():
                    out = start(spec_path, root / f"{name}-{r}", {"WANDB_API_KEY": FAKE_KEY, **env})
                    assert out["mode"] == "offline", (name, out)
                    seconds[name].append(out["elapsed"])
                    note = out["note"] or ""
                    print(f"round {r + 1} {name:<11} {out['elapsed']:6.2f} s  {note}", flush=True)
        finally:
            silent.close()
    base = statistics.median(seconds["offline"])
    print(f"\nmedian of {args.rounds} starts (WandbLog.start alone)")
    print(f"  offline      {base:6.2f} s  (baseline)")
    for name, target in TARGETS.items():
        med = statistics.median(seconds[name])
        verdict = "ok" if med - base < target else "OVER"
        print(
            f"  {name:<12} {med:6.2f} s  +{med - base:.2f} s ({med / base:.1f}x offline);"
            f" target +{target:g} s: {verdict}"
        )


if __name__ == "__main__":
    main()
