"""The runner as a GPU host runs it: `tunebot-runner --spec job.json` on CUDA, for LoRA, QLoRA and a full
fine-tune of the tiny offline model, each one preempted (SIGTERM) mid-run and resumed from its checkpoint.

It checks what the CPU suite cannot: the CUDA paths of the runner (bf16 autocast, bitsandbytes NF4 on the GPU,
the meter's torch.cuda peak readings, checkpoint and resume on a device) end to end in real processes. It
prints one line per run and writes a JSON summary; exit code 1 when any run did not end as expected.

    python bench/gpu_check/runner_smoke.py [--out runner_smoke.json] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = [sys.executable, "-c", "from runner.cli import main; main()"]


def runner_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false"
    )
    return env


def summary_of(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {"status": "no summary"}


def run(
    spec_path: Path, *, preempt_after_step: int | None = None, timeout: float = 240.0
) -> tuple[int, dict, str]:
    """Run the runner; with preempt_after_step, SIGTERM once a checkpoint at or past that step is saved."""
    proc = subprocess.Popen(
        [*RUNNER, "--spec", str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=runner_env(),
        cwd=tempfile.gettempdir(),
    )
    out: list[str] = []
    deadline = time.monotonic() + timeout
    signalled = False
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if preempt_after_step is not None and not signalled and line.startswith("checkpoint saved:"):
            step = int(line.rstrip().rsplit("-", 1)[-1])
            if step >= preempt_after_step:
                proc.send_signal(signal.SIGTERM)
                signalled = True
        if time.monotonic() > deadline:
            proc.kill()
            break
    code = proc.wait()
    text = "".join(out)
    return code, summary_of(text), text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runner_smoke.json"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--methods", default="lora,qlora,full")
    parser.add_argument("--cpu", action="store_true", help="dry run of this script on the CPU (gpus=0)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    if not torch.cuda.is_available() and not args.cpu:
        print("no CUDA device: nothing to check")
        return 0
    from runner.tiny import make_tiny

    device = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    print(f"device {device}; torch {torch.__version__}", flush=True)
    results, ok = [], True
    with tempfile.TemporaryDirectory(prefix="tunebot-runner-smoke-") as tmp:
        for method in args.methods.split(","):
            job_path = make_tiny(Path(tmp) / method, method=method)
            job = json.loads(job_path.read_text())
            job.update(gpus=0 if args.cpu else 1, max_steps=args.steps)
            job["checkpoint"]["every_minutes"] = 0.02
            job["report"] = {"every_seconds": 1.0}
            job_path.write_text(json.dumps(job))
            started = time.monotonic()
            code1, first, text1 = run(job_path, preempt_after_step=5)
            code2, second, text2 = run(job_path)
            elapsed = time.monotonic() - started
            good = code1 == 75 and first.get("status") == "preempted" and code2 == 0
            good = good and second.get("status") == "finished" and bool(second.get("resumed_from"))
            ok &= good
            row = {
                "method": method,
                "preempt_exit": code1,
                "preempt_status": first.get("status"),
                "preempt_step": first.get("steps"),
                "resume_exit": code2,
                "resume_status": second.get("status"),
                "resumed_from": second.get("resumed_from"),
                "steps": second.get("steps"),
                "final_loss": second.get("final_loss"),
                "metrics": second.get("metrics"),
                "seconds": round(elapsed, 1),
                "ok": good,
            }
            results.append(row)
            print(
                f"{method:5s} {'ok ' if good else 'BAD'} "
                f"preempted at step {row['preempt_step']} (exit {code1}), "
                f"resumed from {row['resumed_from']} -> {row['resume_status']} at step {row['steps']} "
                f"(exit {code2}), loss {row['final_loss']}, metrics {row['metrics']}, {elapsed:.0f} s",
                flush=True,
            )
            if not good:
                print("--- first run output (tail) ---\n" + text1[-3000:])
                print("--- second run output (tail) ---\n" + text2[-3000:], flush=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
