"""jobs.plan replaces jobs.spec_overrides: the training plan is stored once (issue 22)

A job kept its training fields twice: the request, from which every launch derived the runner's fields
again, and ``spec_overrides`` (the estimate's plan as JobSpec fields, merged over them). Now ``plan`` alone
holds them (bot/engine/launch.py build_spec reads nothing else). Rows are converted: ``spec_overrides`` as
it was where it holds the plan; for jobs older than the stored plan (no ``base_model`` in it), the fields
a launch used to derive from the request, with what ``spec_overrides`` held merged over them.

Revision ID: 0012_i22
Revises: 0011_i19
Create Date: 2026-12-03 23:00:00
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0012_i22"
down_revision = "0011_i19"
branch_labels = None
depends_on = None

log = logging.getLogger(__name__)

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String()),
    sa.column("request", sa.JSON()),
    sa.column("spec_overrides", sa.JSON()),
    sa.column("plan", sa.JSON()),
)


def plan_of_row(request: dict[str, Any] | None, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The stored plan of an existing row: what its next launch would have used for training fields."""
    overrides = dict(overrides or {})
    if "base_model" in overrides:
        return overrides
    from bot.engine.jobspec import deep_merge, plan_of, spec_fields
    from bot.planner.request import EstimateRequest

    try:
        req = EstimateRequest.model_validate(request or {})
    except ValueError as exc:  # a request this version cannot read: kept as it was (it cannot launch)
        log.warning("a job's request is unreadable; its plan keeps only its overrides: %s", exc)
        return overrides
    return deep_merge(spec_fields(plan_of(req, None)), overrides)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("plan", sa.JSON(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.request, jobs.c.spec_overrides)).all()
    for row in rows:
        plan = plan_of_row(row.request, row.spec_overrides)
        conn.execute(jobs.update().where(jobs.c.id == row.id).values(plan=plan))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("plan", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("spec_overrides")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("spec_overrides", sa.JSON(), nullable=True))
    conn = op.get_bind()
    conn.execute(jobs.update().values(spec_overrides=jobs.c.plan))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("spec_overrides", existing_type=sa.JSON(), nullable=False)
        batch.drop_column("plan")
