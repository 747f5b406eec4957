"""Leave-one-source-out cross-validation of the planner on the published rows (tests/planner/published.py).

For each source (a README table, a paper, a benchmark) the planner's few fitted coefficients (speed: matmul
and SDPA efficiency, elementwise traffic scale, what torch.compile leaves of it, torchao's dequantization
traffic; memory: FSDP units in flight) are refitted on the other sources, and the held-out source's rows are
predicted with them. The held-out errors are the figure to watch; the in-sample ones (fitted on everything)
stand beside them. Prints every row, the summary, the coefficients, and the p10-p90 ratios the estimate's
ranges use.

    .venv/bin/python bench/planner_crossval.py            (~5 s)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "planner"))

from crossval_cases import (  # noqa: E402
    MEMORY_BOUNDS,
    MEMORY_FIELDS,
    SPEED_BOUNDS,
    SPEED_FIELDS,
    memory_cases,
    memory_x0,
    speed_cases,
    speed_x0,
)

from bot.planner import ranges  # noqa: E402
from bot.planner.crossval import Held, leave_one_source_out, summarize  # noqa: E402


def table(title: str, held: list[Held], unit: str) -> None:
    print(f"\n{title}")
    print(
        f"{'source':26s} {'row':40s} {'measured':>9s} {'in-sample':>10s} {'err':>7s} {'held-out':>9s} "
        f"{'err':>7s}"
    )
    for h in held:
        print(
            f"{h.case.source[:26]:26s} {h.case.id[:40]:40s} {h.case.measured:9.2f} {h.in_sample:10.2f} "
            f"{h.in_sample_error:+7.1%} {h.held_out:9.2f} {h.held_out_error:+7.1%}  {unit}"
        )


def line(label: str, held: list[Held]) -> tuple:
    out = summarize([h.held_out_error for h in held])
    ins = summarize([h.in_sample_error for h in held])
    print(
        f"{label:34s} n={out.n:2d}  held-out median {out.median_abs:5.1%} max {out.max_abs:6.1%} | "
        f"in-sample median {ins.median_abs:5.1%} max {ins.max_abs:6.1%} | held-out measured/predicted "
        f"p10 {out.p10_ratio:.3f} p90 {out.p90_ratio:.3f}"
    )
    return out, ins


def main() -> int:
    t0 = time.time()
    speed, speed_coef = leave_one_source_out(speed_cases(), speed_x0(), SPEED_BOUNDS)
    memory, memory_coef = leave_one_source_out(memory_cases(), memory_x0(), MEMORY_BOUNDS)
    guidance, _ = leave_one_source_out(memory_cases(guidance=True), memory_x0(), MEMORY_BOUNDS)
    table("Tokens per second (all GPUs), leave one source out", speed, "tok/s")
    table("Peak memory per GPU (GB, each row in its source's convention), leave one source out", memory, "GB")
    print("\nSummary (errors are predicted/measured - 1; the held-out median is the figure to improve)")
    mem_out, _ = line("memory (measurements)", memory)
    line("memory (+ Unsloth's sizing guide)", guidance)
    speed_out, _ = line("tokens/s", speed)
    print(
        "\ncoefficients fitted on every source: "
        + ", ".join(
            f"{k}={v:.3f}"
            for k, v in zip(SPEED_FIELDS + MEMORY_FIELDS, speed_coef + memory_coef, strict=True)
        )
    )
    print(
        "in the code (bot/planner/speed.py, memory.py): "
        + ", ".join(f"{v:.3f}" for v in speed_x0() + memory_x0())
    )
    print(
        f"ranges (bot/planner/ranges.py): memory {ranges.MEMORY_RATIO}, tokens/s {ranges.SPEED_RATIO}; "
        f"this run: memory ({mem_out.p10_ratio:.3f}, {mem_out.p90_ratio:.3f}), "
        f"tokens/s ({speed_out.p10_ratio:.3f}, {speed_out.p90_ratio:.3f})"
    )
    ok = mem_out.median_abs <= 0.08 and mem_out.max_abs <= 0.25 and speed_out.median_abs <= 0.20
    print(
        f"\ntargets (issue 11): memory median <= 8% and max <= 25%, tokens/s median <= 20% held out: "
        f"{'OK' if ok else 'NOT MET'}  ({time.time() - t0:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
