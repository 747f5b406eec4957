"""Issue 28 (part B): the approved hourly price of a job; who reported a calibration run, and its exclusion

- ``jobs.approved_price_per_hour``: the hourly price a person (or the automatic approval) accepted. A
  relaunch on another offer (after a preemption, out of memory, a resume) rents nothing pricier per hour
  than this (within TUNEBOT_PRICE_TOLERANCE) without asking again (bot/engine/launching/approval.py). Existing
  rows: their accepted offer's price.
- ``calibration_runs.host`` / ``owner``: the rented host that reported a run and the job's owner
  (bot/planner/calibration.py counts one vote per host and asks corroboration across hosts and owners).
  Existing runs: their job's owner, and a host of their own (``legacy:<job id>``; the bot's own machine for
  local jobs).
- ``calibration_runs.excluded_at`` / ``excluded_by``: an admin excluded the run (`tunebot calibrate
  exclude`); it no longer moves any estimate and can be included again.

Revision ID: 0013_i28b
Revises: 0012_i22
Create Date: 2026-12-04 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_i28b"
down_revision = "0012_i22"
branch_labels = None
depends_on = None

jobs = sa.table(
    "jobs",
    sa.column("id", sa.String()),
    sa.column("owner", sa.String()),
    sa.column("provider", sa.String()),
    sa.column("offer", sa.JSON()),
    sa.column("price_per_hour", sa.Float()),
    sa.column("approved_price_per_hour", sa.Float()),
)
runs = sa.table(
    "calibration_runs",
    sa.column("id", sa.Integer()),
    sa.column("job_id", sa.String()),
    sa.column("source", sa.String()),
    sa.column("host", sa.String()),
    sa.column("owner", sa.String()),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("approved_price_per_hour", sa.Float(), nullable=True))
    with op.batch_alter_table("calibration_runs") as batch:
        batch.add_column(sa.Column("host", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("owner", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("excluded_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("excluded_by", sa.String(length=200), nullable=True))
    conn = op.get_bind()
    owners: dict[str, tuple[str, str | None]] = {}
    for row in conn.execute(
        sa.select(jobs.c.id, jobs.c.owner, jobs.c.provider, jobs.c.offer, jobs.c.price_per_hour)
    ):
        owners[row.id] = (row.owner, row.provider)
        offer = row.offer if isinstance(row.offer, dict) else {}
        price = offer.get("price_per_hour", row.price_per_hour)
        if price is not None:
            conn.execute(
                jobs.update().where(jobs.c.id == row.id).values(approved_price_per_hour=float(price))
            )
    for row in conn.execute(
        sa.select(runs.c.id, runs.c.job_id, runs.c.source).where(runs.c.source != "import")
    ):
        owner, provider = owners.get(row.job_id or "", (None, None))
        host = "local" if provider == "local" else f"legacy:{row.job_id}"
        conn.execute(runs.update().where(runs.c.id == row.id).values(host=host, owner=owner))


def downgrade() -> None:
    with op.batch_alter_table("calibration_runs") as batch:
        batch.drop_column("excluded_by")
        batch.drop_column("excluded_at")
        batch.drop_column("owner")
        batch.drop_column("host")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("approved_price_per_hour")
