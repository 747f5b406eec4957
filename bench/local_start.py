"""A local runner's start: plain (`python -P -m runner.cli`) vs forked from the prewarmed process.

Usage: .venv/bin/python bench/local_start.py [--runs 5] [--steps 1]
Each run launches the tiny job (made here) on the local provider and times launch -> the runner's exit
(a job of --steps steps: the start dominates). Prints the median of each and the ratio; both are measured in
this run, on this machine, alternately (so a busy spell hits both).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.providers import prewarm  # noqa: E402
from bot.providers.base import InstanceStatus, LaunchRequest  # noqa: E402
from bot.providers.local import LocalProvider  # noqa: E402


def one(provider: LocalProvider, spec: dict, tag: str) -> tuple[float, bool]:
    started = time.monotonic()
    inst = provider.launch(
        LaunchRequest(
            job_id=f"{tag}-{time.time_ns()}",
            offer=provider.offer(),
            image="unused",
            env={"TUNEBOT_JOB_SPEC": json.dumps(spec)},
        )
    )
    forked = int(provider._record(inst.instance_id)["pid"]) not in provider._children
    while provider.status(inst.instance_id).status == InstanceStatus.running:
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    code = provider.status(inst.instance_id).exit_code
    if code != 0:
        raise SystemExit(f"{tag}: the runner exited {code}: {provider.log_path(inst.instance_id)}")
    return elapsed, forked


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tunebot-bench-start-"))
    make = [sys.executable, "-P", "-m", "runner.cli", "make-tiny", str(work / "tiny")]
    subprocess.run(make, check=True, capture_output=True)
    spec = json.loads((work / "tiny" / "job.json").read_text())
    spec.update(max_steps=args.steps, output_uri=str(work / "output"))
    spec["checkpoint"]["uri"] = str(work / "checkpoints")
    plain = LocalProvider(workdir=work / "plain", prewarm=False)
    warm = LocalProvider(workdir=work / "warm", prewarm=True)
    warm.warm()  # starts the prewarmed process
    pool = prewarm.shared(sys.executable)
    while not any(w.is_ready() for w in pool._warm.values()):
        time.sleep(0.1)
    times: dict[str, list[float]] = {"plain": [], "prewarmed": []}
    for i in range(args.runs):
        times["plain"].append(one(plain, spec, f"plain{i}")[0])
        elapsed, forked = one(warm, spec, f"warm{i}")
        assert forked, "the prewarmed start was not used"
        times["prewarmed"].append(elapsed)
        plain_s = times["plain"][-1]
        print(f"run {i + 1}/{args.runs}: plain {plain_s:.2f} s, prewarmed {elapsed:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nlaunch -> exit of a {args.steps}-step tiny job, median of {args.runs}:")
    print(f"  plain      {med['plain']:.2f} s")
    print(f"  prewarmed  {med['prewarmed']:.2f} s   ({med['plain'] / med['prewarmed']:.1f}x faster)")
    pool.stop()


if __name__ == "__main__":
    main()
