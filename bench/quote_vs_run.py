"""Quote against run on this machine (issue 36 item 6): the shapes a user runs, each quoted on the local
provider and then run by the real runner through the engine, as `tunebot launch` does.

Usage: .venv/bin/python bench/quote_vs_run.py [--quick] [--only lora-long,sweep] [--price 0.10]

Shapes: LoRA on short and long rows, QLoRA, a full fine-tune, eval and samples on, the issue's 200 steps of
128-token rows at micro-batch 2, a resume (stopped half-way, resumed), a four-run sweep. Each is quoted
(`eng.estimate`: the local offer, priced by phase for the share of the cores a run started now gets: this
machine's cores, what already runs on them, the sweep's other runs) and then run; the bench prints, per
shape, the quoted and the reported seconds of every phase, the quoted time and cost (with their range)
against the billed ones (the ledger: the instances' billed seconds at the locked price), and at the end the
ratios billed/quoted: their median, the worst, and how many shapes were billed within the quoted range. The
load average is printed beside every shape, and what the local offer said when it was quoted (its runs
already there, the threads a new run gets, a prewarmed start): on a busy machine every figure moves, the quote
with it (fewer threads). --quick: a quarter of the steps (about a minute on 2 quiet cores); the full bench
takes about 3 minutes.

The goal on a quiet 2-core machine: every shape billed within its quoted range, the median billed/quoted
between 0.9 and 1.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.planner.ranges import speed_ratio  # noqa: E402
from bot.planner.request import EstimateRequest  # noqa: E402
from runner.contract.phases import LABELS, PHASES  # noqa: E402

FINAL = ("succeeded", "failed", "stopped", "cancelled")


@dataclass
class Row:
    name: str
    quoted_s: float
    quoted_range_s: tuple[float, float]
    billed_s: float
    quoted_cost: float
    quoted_cost_range: tuple[float, float]
    billed_cost: float
    load: tuple[float, float]
    phases: list[list[str]]
    state: str
    share: str = ""  # what the local offer said of the machine when the shape was quoted

    @property
    def ratio(self) -> float:
        return self.billed_s / self.quoted_s if self.quoted_s else float("nan")

    @property
    def within(self) -> bool:
        low, high = self.quoted_range_s
        return low <= self.billed_s <= high


def shapes(quick: bool) -> list[tuple[str, dict[str, Any]]]:
    k = 4 if quick else 1
    return [
        ("lora-short", {"seq_len": 256, "batch_size": 4, "grad_accum": 2, "max_steps": 120 // k}),
        ("lora-long", {"seq_len": 2048, "max_steps": 60 // k}),  # the defaults' rows: `tunebot launch` as is
        ("qlora", {"method": "qlora", "seq_len": 512, "max_steps": 60 // k}),
        ("full", {"method": "full", "seq_len": 512, "max_steps": 60 // k}),
        ("eval+samples", {"seq_len": 512, "max_steps": 60 // k, "eval_split": 0.1, "samples": 3}),
        ("rows-128x2", {"seq_len": 128, "batch_size": 2, "max_steps": 200 // k}),
        ("resume", {"seq_len": 512, "max_steps": 240 // k}),
        ("sweep-4", {"seq_len": 256, "max_steps": 40 // k, "eval_split": 0.1}),
    ]


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def wait(eng: Any, job_id: str, *, until: Any = None, timeout: float = 1800) -> Any:
    deadline = time.time() + timeout
    view = eng.get_job(job_id)
    while time.time() < deadline:
        if view.state in FINAL or (until is not None and until(view)):
            return view
        time.sleep(0.3)
        eng.tick()
        view = eng.get_job(job_id)
    raise SystemExit(f"job {job_id} did not end in {timeout:.0f} s (state {view.state})")


def phase_rows(quoted: dict[str, float] | None, ran: dict[str, float] | None) -> list[list[str]]:
    quoted, ran = quoted or {}, ran or {}
    rows = []
    for name in (*PHASES, "preemption"):
        q, r = quoted.get(name, 0.0), ran.get(name, 0.0)
        if max(q, r) >= 0.05:
            rows.append([LABELS.get(name, name), f"{q:.1f}", f"{r:.1f}"])
    return rows


def one_job(eng: Any, name: str, req: EstimateRequest) -> Row:
    load0 = loadavg()
    share = _share(eng)
    est = eng.estimate(req)
    (offer,) = [o for o in est.offers if o.provider == "local"]
    quoted = offer.hours * 3600
    slow, fast = speed_ratio(req)  # the quote's range: the speed's, as every estimate's hours_range
    low, high = quoted / fast, quoted / slow
    # The resume: reports (and checkpoints) often enough for the stop to land half-way, as a person's would.
    fast = (
        {"report": {"every_seconds": 0.5}, "checkpoint": {"every_minutes": 0.02}}
        if name == "resume"
        else None
    )
    job = eng.create_job(
        req, user="bench", estimate=est, max_cost=max(1.0, 20 * offer.total_cost), spec_overrides=fast
    )
    if name == "resume":  # stopped half-way, resumed from its checkpoint
        half = (req.max_steps or 2) // 2
        view = wait(eng, job.job_id, until=lambda v: v.step >= half)
        eng.stop(job.job_id, user="bench")
        view = wait(eng, job.job_id)
        eng.resume(job.job_id, user="bench")
    view = wait(eng, job.job_id)
    price = offer.price_per_hour / 3600
    return Row(
        name=name,
        quoted_s=quoted,
        quoted_range_s=(low, high),
        billed_s=view.billed_seconds or 0.0,
        quoted_cost=quoted * price,
        quoted_cost_range=(low * price, high * price),
        billed_cost=view.spend,
        load=(load0, loadavg()),
        phases=phase_rows(view.quoted_phases, view.run_phases),
        state=view.state,
        share=share,
    )


def _share(eng: Any) -> str:
    """What the local offer says of this machine now: its runs already there, a new run's threads."""
    offer = eng.providers["local"].offer()
    return (
        f"runs here {offer.runs_here:g}, busy {offer.cpu_busy:g} cores, speed {offer.cpu_speed}, threads "
        f"{offer.cpu_threads}, warm {offer.warm_start}"
    )


def sweep(eng: Any, req: EstimateRequest) -> Row:
    load0 = loadavg()
    grid = {"learning_rate": [1e-4, 2e-4], "lora_r": [8, 16]}
    share = _share(eng)
    est = eng.estimate_sweep(req.model_copy(update={"max_cost": 1.0}), grid)
    runs = est._estimates  # noqa: SLF001 - each run's planner estimate: its offer's hours and phases
    hours = [next(o for o in e.offers if o.provider == "local").hours for e in runs]
    view = eng.create_sweep(est, user="bench")
    deadline = time.time() + 1800
    while time.time() < deadline:
        eng.tick()
        view = eng.get_sweep(view.sweep_id)
        if view.state not in ("running", "pending_approval"):
            break
        time.sleep(0.3)
    # Its runs and the job that measures the winner again on another host (control/verify.py): the sweep's
    # expected cost includes that check.
    jobs = [eng.get_job(j.job_id) for j in eng.list_jobs() if j.sweep_id == view.sweep_id]
    billed = sum(j.billed_seconds or 0.0 for j in jobs)
    # The quote: each run's hours over the stages it was expected to run (the sweep's own expected cost).
    ratio = est.estimated_cost / sum(est.run_costs) if sum(est.run_costs) else 1.0
    quoted = sum(hours) * 3600 * ratio
    slow, fast = speed_ratio(req)
    low, high = quoted / fast, quoted / slow
    price = (jobs[0].price_per_hour or 0.0) / 3600 if jobs else 0.0
    return Row(
        name="sweep-4",
        quoted_s=quoted,
        quoted_range_s=(low, high),
        billed_s=billed,
        quoted_cost=quoted * price,
        quoted_cost_range=(low * price, high * price),
        billed_cost=view.spend,
        load=(load0, loadavg()),
        phases=_sweep_phases(eng, view, jobs, price * 3600),
        state=view.state,
        share=share,
    )


def _sweep_phases(eng: Any, view: Any, jobs: list[Any], price_per_hour: float) -> list[list[str]]:
    """Each run's quote at the step it stopped at (RunCost.at_step: its fixed part, its stages' steps, the
    boundaries it paused at) against its billed seconds, then the runs' reported phases summed."""
    from bot.engine.control.sweeps import RunCost
    from store.models import Sweep

    with eng.session() as s:
        plan = s.get(Sweep, view.sweep_id).plan
    costs = [RunCost(**c) for c in plan["costs"]]
    per_s = price_per_hour / 3600 if price_per_hour else 1.0
    rows = []
    for r in view.runs:
        job = eng.get_job(r.job.job_id)
        quoted = costs[r.index].at_step(job.step or 0) / per_s
        rows.append([f"run {r.index} to step {job.step}", f"{quoted:.1f}", f"{job.billed_seconds or 0:.1f}"])
    checks = [j for j in jobs if j.job_id not in {r.job.job_id for r in view.runs}]
    for j in checks:
        rows.append(
            [
                f"verify {j.job_id}",
                f"{plan.get('verify_cost', 0) / per_s:.1f}",
                f"{j.billed_seconds or 0:.1f}",
            ]
        )
    summed: dict[str, float] = {}
    for j in jobs:
        for k, v in (eng.get_job(j.job_id).run_phases or {}).items():
            summed[k] = summed.get(k, 0.0) + v
    rows += [[f"  all runs: {LABELS.get(k, k)}", "-", f"{v:.1f}"] for k, v in summed.items() if v >= 0.05]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run of the bench)")
    parser.add_argument("--only", default="", help="comma-separated shape names")
    parser.add_argument("--price", type=float, default=1.0, help="the local provider's $/h (default $1)")
    args = parser.parse_args()

    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from bot.settings import Settings
    from runner.tiny import make_tiny

    tmp = Path(tempfile.mkdtemp(prefix="quote-vs-run-"))
    tiny = make_tiny(tmp / "tiny").parent
    local = LocalProvider(workdir=tmp / "local", price_per_hour=args.price)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp / "data"), TUNEBOT_ADMINS="bench")
    eng = Engine(settings, db_url=f"sqlite:///{tmp / 'bench.db'}", providers={"local": local})
    only = {s for s in args.only.split(",") if s}
    offer = local.offer()
    print(
        f"cores {offer.cpu_cores}, load {loadavg():.2f}; runners fork from a prewarmed process after the "
        "first"
    )
    rows: list[Row] = []
    for name, fields in shapes(args.quick):
        if only and name not in only:
            continue
        req = EstimateRequest(
            model=str(tiny / "model"), dataset=str(tiny / "data.jsonl"), gpu="cpu", **fields
        )
        row = sweep(eng, req) if name == "sweep-4" else one_job(eng, name, req)
        rows.append(row)
        print(
            f"\n{name}: {row.state}; quoted {row.quoted_s:.1f} s ({row.quoted_range_s[0]:.1f}-"
            f"{row.quoted_range_s[1]:.1f}) ${row.quoted_cost:.5f}; billed {row.billed_s:.1f} s "
            f"${row.billed_cost:.5f}; billed/quoted x{row.ratio:.2f} "
            f"{'within' if row.within else 'OUTSIDE'} the range; load {row.load[0]:.2f} -> "
            f"{row.load[1]:.2f}; quoted with {row.share}"
        )
        print(f"  {'phase':28s} {'quoted s':>9s} {'ran s':>9s}")
        for label, q, r in row.phases:
            print(f"  {label:28s} {q:>9s} {r:>9s}")
    eng.close()
    if not rows:
        return
    ratios = [r.ratio for r in rows]
    print("\nshape            quoted s   billed s   x      range        quoted $   billed $   load")
    for r in rows:
        print(
            f"{r.name:15s} {r.quoted_s:9.1f} {r.billed_s:10.1f} {r.ratio:5.2f}  "
            f"{'within ' if r.within else 'OUTSIDE'}  {r.quoted_cost:10.5f} {r.billed_cost:10.5f}  "
            f"{r.load[0]:.1f}-{r.load[1]:.1f}"
        )
    worst = max(ratios, key=lambda x: abs(x - 1.0))
    print(
        f"\nmedian billed/quoted x{statistics.median(ratios):.2f}; worst x{worst:.2f}; "
        f"{sum(r.within for r in rows)} of {len(rows)} billed within the quoted range"
    )


if __name__ == "__main__":
    main()
