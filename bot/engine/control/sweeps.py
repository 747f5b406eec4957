"""Sweeps: the best run for a budget, by successive halving, never spending more than ``max_cost`` in total.

`sweep MODEL lr=1e-4,2e-4,4e-4 r=8,16 max_cost=$20` trains every configuration (the product of the values;
the other options are shared) as one job each, all at once, and ranks them on the held-out split:

- **Stages.** With n runs there are as many stages as halvings to one run: n -> ceil(n/2) -> ... -> 1. Every
  run is told to evaluate every ``every`` steps (``every`` = the full length / 2^(stages-1)); stage k ends at
  step every x 2^k, the last at the full length. Every run pauses at its stage's last step
  (``JobSpec.stages``: its eval there, a checkpoint, both reported) and trains no further until the sweep
  decides: when every live run has its eval loss at the stage's step (or has ended), the better half is let
  go on from where it waits (stages.py: a decision signed for its run) and the others are stopped there
  (gracefully: the boundary's checkpoint is their result, then the host torn down), so a loser costs what
  its stages were quoted. The last run standing trains to the end and is the winner; its result is its best
  checkpoint (keep=best) and its adapter is the sweep's.
- **Money.** Every run has a cap (the engine stops a job whose projected spend reaches it), and the caps
  are reserved so that their sum can never pass ``max_cost``: a run's need at a stage is its fixed start-up
  cost plus its estimated cost per step times the stage's steps x (1 + SLACK); the worst case is every run's
  first need plus, at each later stage, the increments of the dearest runs that could survive. A sweep is
  refused when even that does not fit ``max_cost`` less MARGIN (what a stop takes to land: a host bills until
  it is gone); otherwise every need is scaled by the headroom, the losers' unspent caps are never handed out
  again, and the promoted runs' caps are raised within the reserve. The tick also stops everything if the
  sweep's spend nears ``max_cost`` whatever the caps say.
- **Approval.** As a launch: the amount at stake is ``max_cost``; above the approval amount a person other
  than the owner approves the sweep (`approve SWEEP`), and its runs are then not asked for again.

``configurations``, ``survivors``, ``stage_steps``, ``worst_case``, ``expected_cost`` and ``ranked`` are pure
(tested directly); ``tick`` advances every running sweep.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from bot.engine.api import (
    EngineError,
    PermissionDenied,
    SweepEstimate,
    SweepRunView,
    SweepView,
)
from bot.engine.context import EngineContext
from bot.engine.control import jobs, stages, verify
from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.launching import admission, approval
from bot.engine.launching import offers as offers_mod
from bot.engine.launching.jobspec import deep_merge
from bot.engine.permissions import Permissions
from bot.engine.record.jobstate import ACTIVE, FINAL, JobState
from bot.engine.views import ts
from bot.money import money
from bot.planner.options import MAX_SWEEP_RUNS, SWEEPABLE
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate
from runner.contract.spec import StageSpec
from store.models import Sweep

log = logging.getLogger(__name__)

# Fields that do not change what a run costs: configurations differing only there share one estimate.
PRICE_FREE = ("learning_rate", "lr_scheduler", "warmup_ratio", "weight_decay")
MAX_RUNS = MAX_SWEEP_RUNS
SWEEP_EVAL_SPLIT = 0.10  # the held-out share a sweep ranks on when the data would get no automatic split
SLACK = 0.5  # a stage's cap covers its estimate x 1.5: estimate error, and waiting for the slower runs
MARGIN = 0.10  # of max_cost never reserved: a stopped run bills until its host is confirmed gone
GUARD = 0.95  # the sweep's spend at this share of max_cost stops every run, whatever the caps say
BOOT_HOURS = 4.0 / 60  # a run's fixed start-up (bot/planner/rank.BOOT_HOURS), at most BOOT_SHARE of it
BOOT_SHARE = 0.25
# The phases of a run's quote that grow with the steps it trains (runner/contract/phases.py); the rest it
# spends once (on the local CPU, four cold runs starting at once: most of a short run's cost).
PER_STEP_PHASES = frozenset({"steps", "optimizer", "logging", "evals", "checkpoints"})
# The phases only a run that reaches its last step spends: a run stopped at a stage writes no samples and no
# output (on 38da01b each stopped run was quoted them: 1.6 s of its 5-s bill).
END_PHASES = frozenset({"samples", "output"})
SWEEP_ID_PREFIX = "sw-"
# How often a run paused at a stage boundary looks for the sweep's decision (runner/stage.py).
STAGE_POLL_S = StageSpec.model_fields["poll_seconds"].default

RUNNING, DONE, STOPPED, FAILED, PENDING, CANCELLED = (
    "running",
    "done",
    "stopped",
    "failed",
    "pending_approval",
    "cancelled",
)
ENDED = frozenset({DONE, STOPPED, FAILED, CANCELLED})


# ---- pure planning -------------------------------------------------------------------------------------


def configurations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the values, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def survivors(n: int) -> list[int]:
    """Runs per stage: [n, ceil(n/2), ..., 1] ([1] for one run)."""
    out = [max(1, n)]
    while out[-1] > 1:
        out.append(math.ceil(out[-1] / 2))
    return out


def stage_steps(total: int, stages: int) -> list[int]:
    """The step each stage ends at: every x 2^k, the last the full length (every = total / 2^(stages-1));
    ValueError when the run is too short to halve that often."""
    if stages <= 1:
        return [total]
    if total < 2 ** (stages - 1):
        raise ValueError(f"{total} steps are too few for {stages} stages: at least {2 ** (stages - 1)}")
    every = total // 2 ** (stages - 1)
    return [*(every * 2**k for k in range(stages - 1)), total]


@dataclass(frozen=True)
class RunCost:
    """One configuration's estimated money: a fixed start-up, a cost per step, its stages' steps, and what
    each stage boundary it pauses at costs."""

    fixed: float
    per_step: float
    steps: list[int]
    # Per stage, a step's cost against the first stage's: on a shared CPU (the local provider) fewer runs
    # share the cores once the losers stop, and each step costs less. None: the same at every stage (a GPU
    # each).
    scale: list[float] | None = None
    # A boundary before the last stage: the checkpoint the run saves there and the wait until it reads the
    # sweep's decision (runner/stage.py; on 0368a4c four tiny runs spent 1.4 s at each, quoted nothing).
    boundary: float = 0.0
    final: float = 0.0  # what only a run that reaches its last step spends (END_PHASES)

    def boundaries(self, step: int) -> int:
        """The stage boundaries a run standing at ``step`` has paused at (the last stage's end is none)."""
        return sum(1 for end in self.steps[:-1] if end <= step)

    def steps_cost(self, stage: int) -> float:
        """The steps' cost from the start to the end of ``stage``."""
        total, done = 0.0, 0
        for k in range(stage + 1):
            factor = self.scale[k] if self.scale and k < len(self.scale) else 1.0
            total += self.per_step * factor * (self.steps[k] - done)
            done = self.steps[k]
        return total

    def at_step(self, step: int) -> float:
        """What the run is quoted to have spent once it stands at ``step``."""
        stage = next((k for k, end in enumerate(self.steps) if step <= end), len(self.steps) - 1)
        before = self.steps_cost(stage - 1) if stage else 0.0
        factor = self.scale[stage] if self.scale and stage < len(self.scale) else 1.0
        steps = self.per_step * factor * (step - (self.steps[stage - 1] if stage else 0))
        end = self.final if step >= self.steps[-1] else 0.0
        return self.fixed + before + steps + self.boundary * self.boundaries(step) + end

    def need(self, stage: int) -> float:
        """What the run may need to reach the end of ``stage`` and pause there, or finish (SLACK included)."""
        last = min(stage, len(self.steps) - 1)
        paused = self.boundary * self.boundaries(self.steps[last])
        end = self.final if last == len(self.steps) - 1 else 0.0
        return self.fixed + (self.steps_cost(stage) + paused + end) * (1.0 + SLACK)

    @classmethod
    def of(
        cls,
        total_cost: float,
        price_per_hour: float,
        steps: list[int],
        phases: dict[str, float] | None = None,
        boundary_s: float = 0.0,
    ) -> RunCost:
        """Split the offer's total by its quote's phases: what a run spends whatever step it stops at
        (start-up, load, data, the base model's eval, the first step), what only a finished run adds (its
        samples and output) and what grows with its steps. Without phases, a cloud's boot is the fixed part
        (at most BOOT_SHARE). ``boundary_s``: the seconds a run spends at each stage boundary."""
        whole = sum((phases or {}).values())
        final = 0.0
        if whole > 0:
            once = {k: v for k, v in (phases or {}).items() if k not in PER_STEP_PHASES}
            final = total_cost * sum(v for k, v in once.items() if k in END_PHASES) / whole
            fixed = total_cost * sum(once.values()) / whole - final
        else:
            fixed = min(total_cost * BOOT_SHARE, price_per_hour * BOOT_HOURS)
        boundary = boundary_s * price_per_hour / 3600.0
        per_step = max(0.0, total_cost - fixed - final) / max(steps[-1], 1)
        return cls(fixed, per_step, steps, boundary=boundary, final=final)


def boundary_seconds(offer: Any, poll_seconds: float = STAGE_POLL_S) -> float:
    """A run's time at a stage boundary: one checkpoint save on its offer, and on average half the interval
    at which it looks for the sweep's decision."""
    return float(getattr(offer, "checkpoint_save_seconds", None) or 0.0) + poll_seconds / 2.0


def worst_case(costs: list[RunCost], alive: list[int]) -> float:
    """The most the caps can ever add up to: every run's first stage, then at each stage the increments of
    the dearest runs that could go on."""
    total = sum(c.need(0) for c in costs)
    for k in range(1, len(alive)):
        deltas = sorted((c.need(k) - c.need(k - 1) for c in costs), reverse=True)
        total += sum(deltas[: alive[k]])
    return total


def expected_cost(costs: list[RunCost], alive: list[int]) -> float:
    """What the sweep is expected to cost (no slack): every run's first stage, then the average run's
    further steps for as many runs as go on."""
    total = sum(c.at_step(c.steps[0]) for c in costs)
    for k in range(1, len(alive)):
        mean = sum(c.at_step(c.steps[k]) - c.at_step(c.steps[k - 1]) for c in costs) / len(costs)
        total += mean * alive[k]
    return total


def ranked(scores: dict[int, float | None]) -> list[int]:
    """Run indices, best (lowest eval loss) first; runs without a score last, then by index."""
    return sorted(scores, key=lambda i: (scores[i] is None, scores[i] if scores[i] is not None else 0.0, i))


def _settings(config: dict[str, Any]) -> dict[str, str]:
    from bot.planner.options import BY_FIELD, as_text

    return {(BY_FIELD[f].key if f in BY_FIELD else f): as_text(v) for f, v in config.items()}


def settings_text(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in _settings(config).items())


# ---- estimate --------------------------------------------------------------------------------------------


def run_request(
    base: EstimateRequest, config: dict[str, Any], eval_every: int | None = None
) -> EstimateRequest:
    """One configuration's request: the shared options, this configuration's values, an eval split to rank
    on (eval= as given, else SWEEP_EVAL_SPLIT unless the data gets the automatic one), no plateau stop (the
    sweep decides who stops), the best step kept, and its eval cadence: the first stage's step (the stages end
    at its multiples). The cadence is in the request, so the estimate prices the passes the runner makes."""
    data = base.model_dump(exclude_unset=True)
    data.update(config)
    data["plateau"] = False
    data.setdefault("keep", "best")
    if eval_every is not None:
        data["eval_every"] = eval_every
    return EstimateRequest(**data)


def check_grid(base: EstimateRequest, grid: dict[str, list[Any]]) -> None:
    bad = [f for f in grid if f not in SWEEPABLE]
    if bad:
        raise EngineError(f"a sweep cannot vary {', '.join(bad)} (it may vary {', '.join(SWEEPABLE)})")
    n = len(configurations(grid))
    if n < 2:
        raise EngineError(
            "a sweep needs two configurations or more: give an option several values, lr=1e-4,2e-4"
        )
    if n > MAX_RUNS:
        raise EngineError(f"{n} configurations: a sweep runs at most {MAX_RUNS}; give fewer values")
    if base.max_cost is None:
        raise EngineError("a sweep needs max_cost=$X: the most the whole sweep may spend")
    if base.eval_split == 0:
        raise EngineError("a sweep ranks its runs on held-out data: drop eval=0 (or give eval=10%)")


def estimate_sweep(
    ctx: EngineContext,
    estimate: Any,
    request: EstimateRequest,
    grid: dict[str, list[Any]],
    *,
    eval_added: bool = False,
) -> SweepEstimate:
    """Price every configuration (one planner estimate per distinct shape: the learning rate and schedule do
    not change the price), plan the stages and the worst case, and say whether max_cost covers it."""
    check_grid(request, grid)
    configs = configurations(grid)
    # Its runs train at once: where they share a machine (the local provider's CPU), each is priced for its
    # share of it (bot/planner/plan.cpu_share).
    request = request.model_copy(update={"runs_at_once": len(configs)})
    max_cost = float(request.max_cost or 0.0)
    approval.checked_cap(max_cost, ctx.settings.max_cost_limit_usd)
    estimates = _priced_runs(estimate, [run_request(request, c) for c in configs])
    # Ranking needs held-out data: without an automatic split on this data, the sweep asks for one.
    held = estimates[0].training.eval_examples if estimates and estimates[0].training else None
    if request.eval_split is None and not held:
        request = request.model_copy(update={"eval_split": SWEEP_EVAL_SPLIT})
        return estimate_sweep(ctx, estimate, request, grid, eval_added=True)
    alive = survivors(len(configs))

    def stages(est: Estimate) -> list[int]:
        try:
            return stage_steps(est.time.steps, len(alive))
        except ValueError as exc:
            raise EngineError(
                f"{exc}: give steps= (or more epochs) for a sweep of {len(configs)} runs"
            ) from None

    # Every run evaluates at its first stage's step: priced again with that cadence (the eval passes change,
    # the steps do not), the one _launch_runs gives the runs.
    estimates = _priced_runs(
        estimate, [run_request(request, c, stages(e)[0]) for c, e in zip(configs, estimates, strict=True)]
    )
    costs: list[RunCost] = []
    where: list[str] = []
    notes: list[str] = []
    stage_scale: list[float] | None = None
    for i, est in enumerate(estimates):
        offer = _chosen(ctx, est)
        if offer is None:
            raise EngineError(
                f"configuration {settings_text(configs[i])}: no offer this bot can launch fits it"
            )
        steps = stages(est)
        cost = RunCost.of(
            offer.total_cost, offer.price_per_hour, steps, offer.phases, boundary_s=boundary_seconds(offer)
        )
        if i == 0:  # the configurations share a shape class: the first's stages serve all
            stage_scale = _stage_scale(ctx, estimate, request, configs[0], steps[0], alive, offer)
        costs.append(dataclasses.replace(cost, scale=stage_scale))
        where.append(f"{offer.provider} {offer.gpu} x{offer.gpu_count} at {money(offer.price_per_hour)}/h")
    # The winner's output is measured again on another host before it is named (verify.py): a run that
    # trains one step and evaluates before and after, priced as such, reserved with the rest.
    verify_cost = _verify_cost(ctx, estimate, run_request(request, configs[0]), costs)
    worst = worst_case(costs, alive) + verify_cost * (1.0 + SLACK)
    budget = max_cost * (1.0 - MARGIN)
    needed = worst / (1.0 - MARGIN)
    feasible = worst <= budget
    notes.append(
        f"before the winner is named, its output is measured again on the held-out split on another host "
        f"(about {money(verify_cost)}): a host's own figures never pick the model alone"
    )
    if eval_added:
        notes.append(
            f"ranked on a {SWEEP_EVAL_SPLIT:.0%} held-out split: the data is too small for the automatic one "
            "(eval= changes it)"
        )
    if not feasible:
        notes.append(
            f"max_cost {money(max_cost)} is not enough: the worst case needs {money(needed)} (the dearest "
            "runs promoted at every stage, room for estimate error); raise max_cost or sweep fewer values"
        )
    out = SweepEstimate(
        request=request,
        grid=grid,
        settings=[_settings(c) for c in configs],
        survivors=alive,
        steps=[c.steps for c in costs],
        run_costs=[round(_chosen(ctx, e).total_cost, 6) for e in estimates],  # type: ignore[union-attr]
        where=where,
        estimated_cost=round(expected_cost(costs, alive) + verify_cost, 6),
        needed_cost=round(needed, 6),
        max_cost=max_cost,
        feasible=feasible,
        scale=round(budget / worst, 6) if worst > 0 else 1.0,
        notes=notes,
        verify_cost=round(verify_cost, 6),
    )
    out._estimates = estimates
    out._costs = costs
    return out


def _verify_cost(ctx: EngineContext, estimate: Any, request: EstimateRequest, costs: list[RunCost]) -> float:
    """What measuring the winner again costs: its start, load, data and two evals (verify.phases_of) on the
    offer a run of one step is priced on, alone (the sweep's runs have ended when it starts: on ebab0c5,
    priced beside all four on this machine's two cores, it spent x0.09-x0.21 of its quote); a run's start-up
    twice where it cannot be priced."""
    probe = request.model_copy(
        update={"max_steps": 1, "samples": 0, "eval_every": None, "max_cost": None, "runs_at_once": 1}
    )
    try:
        offer = _chosen(ctx, estimate(probe))
    except Exception:  # noqa: BLE001 - a shape the planner refuses: the fallback below is dearer, not cheaper
        offer = None
    if offer is not None:
        part = verify.share(offer.phases)
        return float(offer.total_cost) * (part if part is not None else 1.0)
    return 2.0 * max(c.fixed for c in costs)


def _step_seconds(offer: Any) -> float:
    return sum(v for k, v in (offer.phases or {}).items() if k in PER_STEP_PHASES)


def _stage_scale(
    ctx: EngineContext,
    estimate: Any,
    request: EstimateRequest,
    config: dict[str, Any],
    eval_every: int,
    alive: list[int],
    offer: Any,
) -> list[float] | None:
    """On this machine's CPU, a step's cost at each stage against the first: priced again with the runs that
    are left sharing the cores (on 2 cores a sweep of 4 quoted every stage at 4 runs sharing and spent 0.56 of
    its quote). None on a GPU, where each run has its own."""
    base = _step_seconds(offer)
    if offer.gpu != "cpu" or len(alive) < 2 or base <= 0:
        return None
    scale = [1.0]
    for runs in alive[1:]:
        shared = request.model_copy(update={"runs_at_once": runs})
        (est,) = _priced_runs(estimate, [run_request(shared, config, eval_every)])
        later = _chosen(ctx, est)
        scale.append(round(min(1.0, _step_seconds(later) / base), 4) if later is not None else 1.0)
    return scale


def _priced_runs(estimate: Any, requests: list[EstimateRequest]) -> list[Estimate]:
    """One planner estimate per distinct shape (the learning rate and schedule do not change the price), each
    run's training plan with its own values."""
    estimates: list[Estimate] = []
    by_shape: dict[str, Estimate] = {}
    for req in requests:
        shape = req.model_dump_json(exclude=set(PRICE_FREE))
        if shape not in by_shape:
            by_shape[shape] = estimate(req)
        est = by_shape[shape]
        if est.training is not None:
            est = est.model_copy(
                update={"training": est.training.model_copy(update={f: getattr(req, f) for f in PRICE_FREE})}
            )
        estimates.append(est)
    return estimates


def _chosen(ctx: EngineContext, est: Estimate) -> Any:
    fitting = offers_mod.launchable(est.offers, ctx.providers)
    return next((o for o in fitting if "cheapest" in o.labels), None) or offers_mod.pick(fitting, "cheapest")


# ---- create, approve, stop -------------------------------------------------------------------------------


def create(
    ctx: EngineContext,
    policy: Permissions,
    est: SweepEstimate,
    *,
    user: str,
    channel: str | None = None,
    team: str | None = None,
    idempotency_key: str | None = None,
    spec_overrides: dict[str, Any] | None = None,
) -> SweepView:
    """The sweep as priced: refused when it cannot fit max_cost or the owner's running limit; waiting for
    approval above the approval amount; else its runs are created and launched at once."""
    decision = policy.can_launch(user, channel)
    if not decision:
        raise PermissionDenied(decision.reason)
    if idempotency_key:
        with ctx.session() as s:
            found = s.execute(select(Sweep).where(Sweep.idempotency_key == idempotency_key)).scalars().first()
        if found is not None:
            return view(ctx, found.id)
    if not est.feasible:
        raise EngineError(est.notes[-1] if est.notes else "max_cost does not cover this sweep")
    team = team or ctx.settings.default_team
    admission.check_budgets(ctx, owner=user, team=team)
    n = len(est.settings)
    with ctx.session() as s:
        running = admission.running_count(s, user, ACTIVE)
    if not policy.can_run_another(user, running + n - 1):
        limit = policy.max_running_per_user
        raise EngineError(
            f"a sweep runs its {n} configurations at once and you run {running} job(s); one person may run "
            f"{limit} (TUNEBOT_MAX_RUNNING_PER_USER): sweep fewer values or wait"
        )
    needs_approval = policy.needs_approval(max(est.estimated_cost, est.max_cost))
    now = ctx.now()
    sweep_id = SWEEP_ID_PREFIX + uuid.uuid4().hex[:10]
    configs = configurations(est.grid)
    row = Sweep(
        id=sweep_id,
        owner=user,
        team=team,
        channel=channel or None,
        state=PENDING if needs_approval else RUNNING,
        request=est.request.model_dump(mode="json"),
        grid=est.grid,
        plan={
            "survivors": est.survivors,
            "steps": est.steps,
            "scale": est.scale,
            "costs": [c.__dict__ for c in est._costs],
            "spec_overrides": spec_overrides or {},
            "verify_cost": est.verify_cost,
        },
        runs=[
            {"index": i, "config": c, "job_id": None, "status": "pending", "cap": 0.0, "evals": {}}
            for i, c in enumerate(configs)
        ],
        max_cost=est.max_cost,
        estimated_cost=est.estimated_cost,
        approved_by=None if needs_approval else "auto",
        idempotency_key=idempotency_key,
        created_at=now,
        updated_at=now,
    )
    with ctx.session() as s:
        s.add(row)
        try:
            s.commit()
        except IntegrityError:
            s.rollback()
            if idempotency_key:
                with ctx.session() as s2:
                    found = s2.execute(
                        select(Sweep).where(Sweep.idempotency_key == idempotency_key)
                    ).scalars()
                    existing = found.first()
                if existing is not None:
                    return view(ctx, existing.id)
            raise
    stages = " -> ".join(str(a) for a in est.survivors)
    _publish(
        ctx,
        row,
        EngineEventKind.sweep_created,
        f"Sweep {sweep_id}: {n} configurations of {est.request.model}, successive halving {stages}, "
        f"estimated {money(est.estimated_cost)}, at most {money(est.max_cost)}."
        + (
            f" It may spend up to {money(est.max_cost)}, above {money(policy.approval_above)}: it needs "
            f"approval by someone other than {user} (`approve {sweep_id}`)."
            if needs_approval
            else ""
        ),
        approval=needs_approval,
    )
    if not needs_approval:
        _launch_runs(ctx, policy, sweep_id, est._estimates, approver="auto")
    return view(ctx, sweep_id)


def approve(
    ctx: EngineContext, policy: Permissions, estimate: Any, sweep_id: str, *, approver: str
) -> SweepView:
    row = load(ctx, sweep_id)
    decision = policy.can_approve(approver, row.owner, amount=row.max_cost)
    if not decision:
        raise PermissionDenied(decision.reason)
    with ctx.session() as s:
        res = s.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.state == PENDING)
            .values(state=RUNNING, approved_by=approver, updated_at=ctx.now())
        )
        s.commit()
    if res.rowcount != 1:
        current = view(ctx, sweep_id)
        current.message = f"already {current.state}; nothing done"
        return current
    req = EstimateRequest.model_validate(row.request)
    est = estimate_sweep(ctx, estimate, req, {k: list(v) for k, v in row.grid.items()})
    _launch_runs(ctx, policy, sweep_id, est._estimates, approver=approver)
    return view(ctx, sweep_id)


def stop(
    ctx: EngineContext, policy: Permissions, sweep_id: str, *, user: str, reason: str = "user"
) -> SweepView:
    """Stop every run of the sweep (each after a checkpoint); a sweep waiting for approval is cancelled."""
    row = load(ctx, sweep_id)
    decision = policy.can_stop(user, row.owner)
    if not decision:
        raise PermissionDenied("only the sweep's owner or an admin may stop it")
    if row.state in ENDED:
        return view(ctx, sweep_id)
    final = CANCELLED if row.state == PENDING else STOPPED
    _end(ctx, row, final, f"Sweep {sweep_id} {final} by {user}.", reason=reason)
    return view(ctx, sweep_id)


def load(ctx: EngineContext, sweep_id: str) -> Sweep:
    from bot.engine.ids import check_job_id

    check_job_id(sweep_id)
    with ctx.session() as s:
        row = s.get(Sweep, sweep_id)
    if row is None:
        raise EngineError(f"no sweep {sweep_id}")
    return row


def is_sweep_id(value: str) -> bool:
    return value.startswith(SWEEP_ID_PREFIX)


# ---- runs ------------------------------------------------------------------------------------------------


def _launch_runs(
    ctx: EngineContext, policy: Permissions, sweep_id: str, estimates: list[Estimate], *, approver: str
) -> None:
    """Create and launch every configuration's job with its first stage's cap."""
    row = load(ctx, sweep_id)
    plan = row.plan
    costs = [RunCost(**c) for c in plan["costs"]]
    base = EstimateRequest.model_validate(row.request)
    runs = [dict(r) for r in row.runs]
    for run, est, cost in zip(runs, estimates, costs, strict=True):
        cap = round(plan["scale"] * cost.need(0), 6)
        # The cadence the estimate priced (run_request): its JobSpec gets it from the plan, like every field.
        req = run_request(base, run["config"], cost.steps[0]).model_copy(update={"max_cost": cap})
        # It pauses at each stage's last step until the sweep decides (stages.py): a run the sweep stops
        # never trains past its stage.
        overrides = deep_merge(plan.get("spec_overrides") or {}, stages.stage_overrides(cost.steps))
        try:
            job = jobs.create(
                ctx,
                policy,
                req,
                est,
                user=row.owner,
                max_cost=cap,
                channel=row.channel,
                idempotency_key=f"{sweep_id}:{run['index']}",
                team=row.team,
                spec_overrides=overrides,
                approved_by=approver,
                sweep_id=sweep_id,
            )
        except EngineError as exc:
            run.update(status="failed", note=f"not launched: {exc}"[:500])
            continue
        run.update(job_id=job.job_id, status="running", cap=cap)
    _save_runs(ctx, sweep_id, runs)


def _save_runs(ctx: EngineContext, sweep_id: str, runs: list[dict[str, Any]], **values: Any) -> None:
    with ctx.session() as s:
        s.execute(update(Sweep).where(Sweep.id == sweep_id).values(runs=runs, updated_at=ctx.now(), **values))
        s.commit()


def _raise_cap(ctx: EngineContext, job_id: str, cap: float) -> None:
    """A promoted run's cap, raised within what the sweep reserved for it (accepted: the sweep was)."""
    from store.models import Job

    with ctx.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(max_cost=cap, approved_cost=cap))
        s.commit()


def _evals(ctx: EngineContext, job_id: str) -> dict[int, float]:
    from bot.engine.outcome import series

    return dict(series.job_series(ctx, job_id).eval)


def tick(ctx: EngineContext, policy: Permissions) -> int:
    """Advance every running sweep: a stage decided when its runs are all in, the end when the last run
    ends, everything stopped near max_cost. Returns how many sweeps changed."""
    with ctx.session() as s:
        ids = list(s.execute(select(Sweep.id).where(Sweep.state == RUNNING)).scalars())
    changed = 0
    for sweep_id in ids:
        try:
            changed += bool(advance(ctx, policy, sweep_id))
        except Exception:  # noqa: BLE001 - one sweep never stops the others; the next tick tries again
            log.exception("advancing sweep %s failed", sweep_id)
    return changed


def advance(ctx: EngineContext, policy: Permissions, sweep_id: str) -> bool:
    row = load(ctx, sweep_id)
    if row.state != RUNNING:
        return False
    plan, runs = row.plan, [dict(r) for r in row.runs]
    costs = [RunCost(**c) for c in plan["costs"]]
    alive_plan: list[int] = plan["survivors"]
    stage = row.stage
    last = len(alive_plan) - 1
    views = {r["job_id"]: jobs.view(ctx, r["job_id"]) for r in runs if r.get("job_id")}
    spend = _spend(ctx, row, views)
    if spend >= GUARD * row.max_cost:
        _end(
            ctx,
            row,
            STOPPED,
            f"Sweep {sweep_id} stopped: it has spent {money(spend)} of {money(row.max_cost)}.",
            reason="budget",
        )
        return True
    live = [r for r in runs if r["status"] == "running"]
    if not live:
        _end(ctx, row, FAILED, f"Sweep {sweep_id} failed: no run is left ({_notes(runs)}).", reason="failed")
        return True
    _release_kept(ctx, runs, costs, stage)
    if stage >= last:
        _save_if_changed(ctx, row, runs)
        return _finish_if_done(ctx, row, runs, views)
    scores: dict[int, float | None] = {}
    for r in live:
        i = r["index"]
        rung = costs[i].steps[stage]
        job = views[r["job_id"]]
        evals = _evals(ctx, r["job_id"])
        if rung in evals:
            r["evals"] = {**r.get("evals", {}), str(rung): evals[rung]}
            scores[i] = evals[rung]
        elif job.state in FINAL:
            scores[i] = None
            r.update(status="failed", note=f"ended ({job.state}) before step {rung}")
        else:
            return _save_if_changed(ctx, row, runs)  # still training towards this stage's step
    order = [i for i in ranked(scores) if scores[i] is not None]
    keep = order[: alive_plan[stage + 1]]
    lost = [i for i in order if i not in keep]
    if not keep:
        _save_runs(ctx, sweep_id, runs)
        _end(
            ctx,
            load(ctx, sweep_id),
            FAILED,
            f"Sweep {sweep_id} failed: no run reached stage {stage + 1}.",
            reason="failed",
        )
        return True
    by_index = {r["index"]: r for r in runs}
    for i in lost:
        by_index[i].update(status="lost", note=f"stopped after stage {stage + 1}")
    for i in keep:
        by_index[i]["cap"] = round(plan["scale"] * costs[i].need(stage + 1), 6)
    with ctx.session() as s:
        res = s.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.stage == stage, Sweep.state == RUNNING)
            .values(stage=stage + 1, runs=runs, updated_at=ctx.now())
        )
        s.commit()
    if res.rowcount != 1:
        return False  # another process decided this stage
    _release_kept(ctx, runs, costs, stage + 1)  # the kept runs go on from the boundary they wait at
    _save_runs(ctx, sweep_id, runs)
    for i in lost:
        job_id = by_index[i]["job_id"]
        if views[job_id].state not in FINAL:
            jobs.request_stop(ctx, job_id, reason="sweep", actor="sweep")
    for i in keep:
        _promote(ctx, policy, row, by_index[i], views[by_index[i]["job_id"]])

    def line(i: int) -> str:
        r = by_index[i]
        return f"{r['job_id']} {settings_text(r['config'])} ({scores[i]:.4f})"

    step = ", ".join(sorted({str(costs[i].steps[stage]) for i in scores}))
    _publish(
        ctx,
        load(ctx, sweep_id),
        EngineEventKind.sweep_stage,
        f"Sweep {sweep_id}, stage {stage + 1} of {last + 1} (eval loss at step {step}): kept "
        + "; ".join(line(i) for i in keep)
        + (". Stopped " + "; ".join(line(i) for i in lost) if lost else "")
        + f". Spent {money(spend)} of {money(row.max_cost)}.",
        stage=stage + 1,
        kept=[by_index[i]["job_id"] for i in keep],
        stopped=[by_index[i]["job_id"] for i in lost],
    )
    return True


def _release_kept(ctx: EngineContext, runs: list[dict[str, Any]], costs: list[RunCost], stage: int) -> None:
    """Every run kept past stage ``stage - 1`` has the sweep's word to go on, for its current run: a job
    relaunched after it (preempted, resumed) is a new run waiting again at the boundary (stages.py)."""
    if stage <= 0:
        return
    for r in runs:
        if r["status"] != "running" or not r.get("job_id"):
            continue
        through = costs[r["index"]].steps[stage - 1]
        run_id = stages.current_run(ctx, r["job_id"])
        if run_id is None or r.get("released") == [run_id, through]:
            continue
        cap = float(r.get("cap") or 0.0) or None
        if stages.release(ctx, r["job_id"], run_id, through=through, max_cost=cap):
            r["released"] = [run_id, through]


def _promote(ctx: EngineContext, policy: Permissions, row: Sweep, run: dict[str, Any], job: Any) -> None:
    """A run that goes on: its cap raised; resumed from its checkpoint if its cap had stopped it meanwhile."""
    _raise_cap(ctx, run["job_id"], run["cap"])
    if job.state in FINAL and job.state != JobState.SUCCEEDED:
        from bot.engine.control import resume as resume_mod

        try:
            resume_mod.resume(
                ctx, policy, run["job_id"], user=row.owner, max_cost=run["cap"], channel=row.channel
            )
        except EngineError as exc:
            log.warning("sweep %s: promoted run %s not resumed: %s", row.id, run["job_id"], exc)


def _finish_if_done(
    ctx: EngineContext, row: Sweep, runs: list[dict[str, Any]], views: dict[str, Any]
) -> bool:
    live = [r for r in runs if r["status"] == "running"]
    ended = [r for r in live if views[r["job_id"]].state in FINAL]
    if len(ended) < len(live):
        return False
    good = [
        r
        for r in ended
        if views[r["job_id"]].state == JobState.SUCCEEDED or views[r["job_id"]].stop_reason == "plateau"
    ]
    if not good:
        for r in ended:
            r.update(status="failed", note=f"ended {views[r['job_id']].state}")
        _save_runs(ctx, row.id, runs)
        _end(
            ctx,
            load(ctx, row.id),
            FAILED,
            f"Sweep {row.id} failed: its last run did not finish ({_notes(runs)}).",
            reason="failed",
        )
        return True

    def score(r: dict[str, Any]) -> float:
        res = views[r["job_id"]].results
        return res.eval_after if res is not None and res.eval_after is not None else math.inf

    best = min(good, key=score)
    winner = views[best["job_id"]]
    # Its host's figure alone never names it: its output is measured again on another host (verify.py).
    claimed = winner.results.eval_after if winner.results is not None else None
    cap = round(
        float(row.plan.get("scale") or 1.0) * float(row.plan.get("verify_cost") or 0.0) * (1 + SLACK), 6
    )
    verdict = verify.step(ctx, row, winner.job_id, claimed, max(cap, 0.01))
    if verdict.state == "waiting":
        note = f"its output is measured again {verify.ELSEWHERE} (job {verdict.job_id})"
        if best.get("note") != note:
            best["note"] = note
            _save_runs(ctx, row.id, runs)
            _publish(
                ctx,
                load(ctx, row.id),
                EngineEventKind.sweep_stage,
                f"Sweep {row.id}: job {winner.job_id} ({settings_text(best['config'])}) reports the lowest "
                f"eval loss{f' ({claimed:.4f})' if claimed is not None else ''}; before it is named the "
                f"winner, its output is measured again on the held-out split {verify.ELSEWHERE} (job "
                f"{verdict.job_id}).",
                verifying=verdict.job_id,
            )
            return True
        return False
    spend = _spend(ctx, load(ctx, row.id), views)
    if verdict.state != "holds":
        best.update(status="excluded", note=verdict.note)
        for r in ended:
            if r is not best:
                r["status"] = "lost"
        _save_runs(ctx, row.id, runs)
        _end(
            ctx,
            load(ctx, row.id),
            FAILED,
            f"Sweep {row.id}: no winner. Job {winner.job_id} ({settings_text(best['config'])}) is excluded: "
            f"{verdict.note}. The stages were decided on the figures its host reported, so no other run is "
            f"named in its place (`compare {row.id}` shows them all). Spent {money(spend)} of "
            f"{money(row.max_cost)}.",
            reason="unverified",
        )
        return True
    for r in ended:
        r["status"] = "won" if r is best else "lost"
    res = verdict.measured
    bought = ""
    if res is not None and res.eval_before is not None and res.eval_after is not None:
        change = (res.eval_after / res.eval_before - 1.0) * 100 if res.eval_before > 0 else 0.0
        bought = (
            f": eval loss {res.eval_before:.4f} -> {res.eval_after:.4f} ({change:+.0f}%), measured again "
            f"{verify.ELSEWHERE} (job {verdict.job_id})"
        )
    with ctx.session() as s:
        res_ = s.execute(
            update(Sweep)
            .where(Sweep.id == row.id, Sweep.state == RUNNING)
            .values(state=DONE, runs=runs, winner=winner.job_id, finished_at=ctx.now(), updated_at=ctx.now())
        )
        s.commit()
    if res_.rowcount != 1:
        return False
    out = f" Adapter: {winner.output_uri}." if winner.output_uri else ""
    message = (
        f"Sweep {row.id} done. Winner: job {winner.job_id} ({settings_text(best['config'])}){bought}.{out} "
        f"Spent {money(spend)} of max {money(row.max_cost)} on {len(runs)} runs."
    )
    with ctx.session() as s:
        s.execute(update(Sweep).where(Sweep.id == row.id).values(message=message[:2000]))
        s.commit()
    _publish(ctx, load(ctx, row.id), EngineEventKind.sweep_done, message, state=DONE, winner=winner.job_id)
    return True


def _verifiers(row: Sweep) -> list[str]:
    """The sweep's verification jobs (verify.py): its jobs too, their spend the sweep's."""
    return [v["job"] for v in ((row.plan or {}).get("verification") or {}).values() if v.get("job")]


def _spend(ctx: EngineContext, row: Sweep, views: dict[str, Any]) -> float:
    """What the sweep has spent: its runs' and its verification jobs'."""
    return sum(v.spend for v in views.values()) + sum(jobs.view(ctx, j).spend for j in _verifiers(row))


def _notes(runs: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{r.get('job_id') or '#' + str(r['index'])}: {r.get('note') or r['status']}" for r in runs
    )


def _save_if_changed(ctx: EngineContext, row: Sweep, runs: list[dict[str, Any]]) -> bool:
    if runs != row.runs:
        _save_runs(ctx, row.id, runs)
    return False


def _end(ctx: EngineContext, row: Sweep, state: str, message: str, *, reason: str) -> None:
    """The sweep ends in ``state``: every run still going is stopped (a checkpoint first)."""
    runs = [dict(r) for r in row.runs]
    with ctx.session() as s:
        res = s.execute(
            update(Sweep)
            .where(Sweep.id == row.id, Sweep.state.in_([RUNNING, PENDING]))
            .values(state=state, message=message[:2000], finished_at=ctx.now(), updated_at=ctx.now())
        )
        s.commit()
    if res.rowcount != 1:
        return
    for r in runs:
        if r.get("job_id") and r["status"] == "running":
            job = jobs.view(ctx, r["job_id"])
            if job.state not in FINAL:
                jobs.request_stop(ctx, r["job_id"], reason="sweep", actor="sweep")
            r.update(status="stopped", note=f"sweep {state}")
    for job_id in _verifiers(row):  # a verification still measuring is the sweep's too
        if jobs.view(ctx, job_id).state not in FINAL:
            jobs.request_stop(ctx, job_id, reason="sweep", actor="sweep")
    _save_runs(ctx, row.id, runs)
    _publish(ctx, load(ctx, row.id), EngineEventKind.sweep_done, message, state=state, reason=reason)


def _publish(ctx: EngineContext, row: Sweep, kind: EngineEventKind, message: str, **data: Any) -> None:
    ctx.bus.publish(
        EngineEvent(
            kind=kind,
            user=row.owner,
            channel=row.channel,
            thread_ts=row.thread_ts,
            message=message,
            data={"sweep_id": row.id, **data},
            at=ctx.now(),
        )
    )


# ---- views -----------------------------------------------------------------------------------------------


def view(ctx: EngineContext, sweep_id: str) -> SweepView:
    row = load(ctx, sweep_id)
    runs: list[SweepRunView] = []
    spend = reserved = 0.0
    for r in row.runs:
        job = jobs.view(ctx, r["job_id"]) if r.get("job_id") else None
        if job is not None:
            spend += job.spend
            reserved += job.spend if job.state in FINAL else max(job.spend, float(r.get("cap") or 0.0))
        runs.append(
            SweepRunView(
                index=r["index"],
                settings=_settings(r["config"]),
                job=job.model_copy(update={"losses": []}) if job is not None else None,
                status=r["status"],
                stage_evals={int(k): float(v) for k, v in (r.get("evals") or {}).items()},
                cap=float(r.get("cap") or 0.0),
                note=r.get("note"),
            )
        )
    for job_id in _verifiers(row):  # measuring the winner again: the sweep's money too
        checker = jobs.view(ctx, job_id)
        spend += checker.spend
        reserved += checker.spend if checker.state in FINAL else max(checker.spend, checker.max_cost or 0.0)
    return SweepView(
        sweep_id=row.id,
        owner=row.owner,
        state=row.state,
        model=str((row.request or {}).get("model", "")),
        stage=row.stage,
        survivors=list(row.plan.get("survivors") or []),
        max_cost=row.max_cost,
        estimated_cost=row.estimated_cost,
        spend=round(spend, 6),
        reserved=round(reserved, 6),
        runs=runs,
        winner=row.winner,
        message=row.message,
        channel=row.channel,
        thread_ts=row.thread_ts,
        created_at=ts(row.created_at),
        updated_at=ts(row.updated_at),
    )


def set_thread(ctx: EngineContext, sweep_id: str, *, channel: str, thread_ts: str) -> None:
    with ctx.session() as s:
        s.execute(update(Sweep).where(Sweep.id == sweep_id).values(channel=channel, thread_ts=thread_ts))
        s.commit()
