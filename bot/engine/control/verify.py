"""Before a sweep names its winner, the winner's figure is measured again by a host that did not make it.

A sweep ranks its runs on the eval losses their own hosts report: signed and bounded, but each host's claim
(docs/security.md: reports from hosts move nothing on their own). The winner's output becomes the team's
model, so its claim alone must not decide it: a host reporting an eval loss of 0.01 at every stage would win.
Before the winner is announced, ``step`` starts a verification job: a copy of the winner's job (its base
model, data, held-out split and LoRA shape: its plan) that trains nothing and measures the base model and the
winner's output as its run signed it (``JobSpec.verify``, runner/verify.py: pinned by the manifest's digest
the bot recorded from the winner's signed event) on the held-out split. It runs on another host: not on an
offer any of the winner's instances ran on (the local provider is this machine: the bot's own), taken from the
offers of every run of the sweep; where there is none, the winner is not measured by its own host again (a
marketplace offer is one machine, its operator the claimant) and the sweep names no winner, saying why. Its
cost was priced and reserved with the sweep (``verify_cost``), and it is one of the sweep's jobs (its spend
counts).

The winner stands when the measured eval loss is within the tolerance of its claim (``holds``, pure), and
the sweep then says the measured figures; otherwise the run is excluded with both figures in the sweep's
thread and the sweep names no winner: its stages were decided on claims that host could move. A
verification that does not finish (its host failed, no offer) names no winner either, saying why: no model
is adopted unchecked.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from bot.engine.record.jobstate import FINAL, JobState
from runner.contract.spec import RunResults

if TYPE_CHECKING:
    from bot.engine.context import EngineContext
    from store.models import Sweep

log = logging.getLogger(__name__)

# A claim holds when the figure measured on another host is at most this much higher: numerics differ
# between devices and dtypes (a bf16 GPU against an fp32 one, another kernel), never by a tenth.
TOLERANCE_REL = 0.10
TOLERANCE_ABS = 0.02
LOCAL = "local"  # the local provider's "hosts" are this machine: a verification there is the bot's own
ELSEWHERE = "on another host"


# What a verification run spends (runner/verify.py), by the phases a run is quoted in: its start, the
# model's load (the output's fetch beside it), the data, W&B's start, the base model's eval and then the
# output's, the same pass over the same held-out split (so priced as the base model's). It trains, answers
# and saves nothing.
SPENDS = ("start", "load", "data", "wandb", "base_eval")


def phases_of(run: dict[str, float] | None) -> dict[str, float]:
    """A verification's quote by phase from a run's quote (pure): what it does of that run, nothing else
    (on ebab0c5 a sweep priced it as a run of one step beside all of its runs: x0.09 of what it spent)."""
    run = run or {}
    out = {k: float(run[k]) for k in SPENDS if k in run}
    if "base_eval" in out:
        out["evals"] = out["base_eval"]
    return out


def share(run: dict[str, float] | None) -> float | None:
    """The part of a run's quote its verification spends (pure); None without phases to tell."""
    whole = sum((run or {}).values())
    return sum(phases_of(run).values()) / whole if whole > 0 else None


def holds(claimed: float | None, measured: float | None) -> bool:
    """Whether a host's claimed eval loss survives the one measured elsewhere (pure): not more than
    TOLERANCE_REL + TOLERANCE_ABS below it. A run claiming worse than it is harms only itself."""
    if claimed is None or measured is None:
        return False
    return measured <= claimed * (1.0 + TOLERANCE_REL) + TOLERANCE_ABS


def other_hosts(offers: list[dict[str, Any]], used: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The offers a verification may run on: those none of the winner's instances ran on (a marketplace offer
    is one machine; the local provider is the bot's own), each once, in the order given (pure). Never the
    winner's own: a new instance there is the claiming host measuring itself."""
    seen: set[tuple[str, str]] = set()
    other = []
    for o in offers:
        key = (str(o.get("provider")), str(o.get("offer_id")))
        if key in seen or (o.get("provider") != LOCAL and key in used):
            continue
        seen.add(key)
        other.append(o)
    return other


@dataclass(frozen=True)
class Verdict:
    """Where a finalist's check stands: "waiting" (the verification job runs), "holds", "refused" (the claim
    did not survive) or "failed" (no measurement: ``note`` says why); ``measured``: the verification's."""

    state: str
    measured: RunResults | None = None
    note: str = ""
    job_id: str | None = None


def step(ctx: EngineContext, row: Sweep, job_id: str, claimed: float | None, cap: float) -> Verdict:
    """The check of finalist ``job_id`` (its claim ``claimed``): started on the first call (a verification
    job with cap ``cap``), then read until its verification job ends."""
    from bot.engine.control import jobs

    started = dict((row.plan or {}).get("verification") or {})
    entry = started.get(job_id)
    if entry is None:
        try:
            verifier = _create(ctx, row, job_id, cap)
        except Exception as exc:  # noqa: BLE001 - said in the thread; the sweep names no unchecked winner
            log.warning("sweep %s: verification of %s not started: %s", row.id, job_id, exc)
            return Verdict("failed", note=f"the verification could not start ({exc})"[:300])
        started[job_id] = {"job": verifier, "claimed": claimed}
        with ctx.session() as s:
            s.execute(
                update(type(row))
                .where(type(row).id == row.id)
                .values(plan={**(row.plan or {}), "verification": started}, updated_at=ctx.now())
            )
            s.commit()
        return Verdict("waiting", job_id=verifier)
    verifier = entry["job"]
    view = jobs.view(ctx, verifier)
    if view.state not in FINAL:
        return Verdict("waiting", job_id=verifier)
    measured = view.results
    if view.state != JobState.SUCCEEDED or measured is None or measured.eval_after is None:
        why = view.message or view.state
        note = f"its verification (job {verifier}) ended {why}"[:300]
        return Verdict("failed", note=note, job_id=verifier)
    if holds(claimed, measured.eval_after):
        return Verdict("holds", measured, job_id=verifier)
    reported = f"its host reported eval loss {claimed:.4f}" if claimed is not None else "it reported none"
    return Verdict(
        "refused",
        measured,
        note=f"{reported}; measured again {ELSEWHERE} (job {verifier}): {measured.eval_after:.4f}",
        job_id=verifier,
    )


def _create(ctx: EngineContext, row: Sweep, job_id: str, cap: float) -> str:
    """The verification job of finalist ``job_id``: its plan with the output to measure and nothing to
    train, answer or push, on an offer none of its instances ran on (``other_hosts``: the finalist's offers,
    then the sweep's other runs'); approved by the sweep, launched now. Its id; ValueError when no other host
    has an offer."""
    from bot.engine.control import jobs
    from bot.engine.launching.launch import storage_root
    from bot.engine.record import runs
    from bot.engine.record import states as S
    from store.models import Instance, Job

    finalist = jobs.load(ctx, job_id)
    output = runs.reported_output(ctx, job_id)
    if output is None or not output.output_uri or not output.output_manifest_sha256:
        raise ValueError("its run reported no signed output")
    with ctx.session() as s:
        used = {
            (i.provider, str(i.offer_id))
            for i in s.execute(select(Instance).where(Instance.job_id == job_id)).scalars()
        }
        siblings = s.execute(
            select(Job.offers).where(Job.sweep_id == row.id, Job.id != job_id).order_by(Job.created_at)
        ).scalars()
        known = list(finalist.offers or [finalist.offer]) + [o for offers in siblings for o in offers or []]
    offers = other_hosts(known, used)
    if not offers:
        raise ValueError(
            "no offer on another host: every offer the sweep had is the one the winner's host ran on, and "
            "that host measuring itself proves nothing"
        )
    chosen = dict(offers[0])
    part = share(chosen.get("phases"))
    if part is not None:  # its quote is the verification's, not the run's it copies
        chosen["total_cost"] = round(float(chosen.get("total_cost") or 0.0) * part, 6)
        chosen["phases"] = phases_of(chosen["phases"])
    plan = {k: v for k, v in (finalist.plan or {}).items() if k not in ("stages", "push_to_hub", "resume")}
    plan["merge"] = False
    plan["samples"] = {**(plan.get("samples") or {}), "count": 0, "prompts": None}
    plan["plateau"] = {**(plan.get("plateau") or {}), "enabled": False}
    plan["verify"] = {
        "job_id": job_id,
        "uri": output.output_uri,
        "manifest_sha256": output.output_manifest_sha256,
    }
    new_id = uuid.uuid4().hex[:12]
    now = ctx.now()
    price = float(chosen.get("price_per_hour") or 0.0)
    job = Job(
        id=new_id,
        owner=finalist.owner,
        team=finalist.team,
        channel=finalist.channel,
        state=S.APPROVED,
        request=dict(finalist.request or {}),
        choice="verify",
        offer=chosen,
        offers=offers,
        plan=plan,
        provider=chosen.get("provider"),
        gpu=chosen.get("gpu"),
        gpu_count=chosen.get("gpu_count"),
        interruptible=bool(chosen.get("interruptible")),
        price_per_hour=price,
        estimated_cost=cap,
        max_cost=cap,
        approved_cost=cap,
        approved_price_per_hour=price,
        checkpoint_minutes=finalist.checkpoint_minutes,
        disk_gb=finalist.disk_gb,
        start_deadline_s=finalist.start_deadline_s,
        idempotency_key=f"{row.id}:verify:{job_id}",
        checkpoint_uri=f"{storage_root(ctx, new_id)}/checkpoints",
        created_at=now,
        updated_at=now,
        approved_by="sweep",
        sweep_id=row.id,
    )
    with ctx.session() as s:
        s.add(job)
        S.audit(s, actor="sweep", action="create", job_id=new_id, at=now, verifies=job_id, max_cost=cap)
        s.commit()
    jobs.launch(ctx, new_id, user="sweep")
    return new_id
