"""`compare JOB JOB...`: runs side by side, as bought: the settings that differ, eval loss before and after,
cost, time, and every run's eval curve (the chat draws them on one chart with the cost marked).

The caller may read each job (its owner, or an admin: the permissions policy); one they may not read is
answered as one that does not exist ("no job X"). Runs on different data (another dataset, eval split or seed)
are compared with a note saying their eval losses are not on the same examples. ``differing`` is pure (tested
directly); ``compare`` reads the rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from bot.engine.api import CompareRun, CompareView, EngineError
from bot.engine.context import EngineContext
from bot.engine.ids import check_job_id
from bot.engine.permissions import Permissions
from store.models import Instance

MAX_COMPARED = 12
# Request fields that say how a run was trained (shown when they differ); the data's fields decide whether
# the eval losses are comparable at all.
DATA_FIELDS = ("model", "dataset", "eval_split", "seed")
SKIPPED = ("max_cost", "interruptible", "gpu", "gpus", "push_to_hub", "hub_public", "merge", "prompts")


def differing(requests: list[dict[str, Any]]) -> list[str]:
    """The request fields (option-table fields, plus model) whose values are not the same in every run, in
    the options table's order."""
    from bot.planner.options import OPTIONS

    fields = ["model", *(o.field for o in OPTIONS if o.field not in SKIPPED)]
    out = []
    for name in fields:
        values = {repr(r.get(name)) for r in requests}
        if len(values) > 1:
            out.append(name)
    return out


def setting_text(field: str, value: Any) -> str:
    """A request value as its option key would take it (`lr=0.0002`, `r=16`)."""
    from bot.planner.options import BY_FIELD, as_text

    if value is None:
        return "-"
    option = BY_FIELD.get(field)
    return as_text(value) if option else str(value)


def compare(ctx: EngineContext, policy: Permissions, job_ids: list[str], *, user: str) -> CompareView:
    from bot.engine.control import jobs
    from bot.engine.outcome import series

    ids = list(dict.fromkeys(check_job_id(j) for j in job_ids))
    if len(ids) < 2:
        raise EngineError("`compare` needs two jobs or more (see `jobs`)")
    if len(ids) > MAX_COMPARED:
        raise EngineError(f"`compare` takes at most {MAX_COMPARED} jobs")
    rows = []
    for job_id in ids:  # the read rule of `status` (TEAM_READ included), job by job as each is looked up
        row = jobs.load(ctx, job_id)
        if not policy.can_read(user, row.owner).allowed:  # as for a job that does not exist: no answer says
            raise EngineError(f"no job {job_id}")  # whether another member's job exists, nor whose it is
        rows.append(row)
    requests = [dict(r.request or {}) for r in rows]
    diff = differing(requests)
    now = ctx.now()
    runs: list[CompareRun] = []
    with ctx.session() as s:
        instances = s.execute(select(Instance).where(Instance.job_id.in_(ids))).scalars().all()
    for row, req in zip(rows, requests, strict=True):
        view = jobs.view(ctx, row.id)
        billed = sum(max(0.0, (i.ended_at or now) - i.launched_at) for i in instances if i.job_id == row.id)
        curve = series.job_series(ctx, row.id).eval
        runs.append(
            CompareRun(
                job=view.model_copy(update={"losses": []}),
                settings={f: setting_text(f, req.get(f)) for f in diff},
                hours=round(billed / 3600.0, 6),
                eval=curve,
            )
        )
    notes = []
    mixed = [f for f in DATA_FIELDS if len({repr(r.get(f)) for r in requests}) > 1]
    if mixed:
        notes.append(
            f"not the same data ({', '.join(mixed)} differ): their eval losses are not measured on the same "
            "examples"
        )
    return CompareView(runs=runs, differing=diff, same_data=not mixed, notes=notes)
