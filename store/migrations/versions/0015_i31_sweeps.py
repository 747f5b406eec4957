"""What the money bought (issue 31): jobs.results, jobs.sweep_id and the sweeps table

- ``jobs.results``: the runner's results event as the bot kept it (eval loss of the base model before
  training and of the result after, which step the result is and why, the side-by-side answers; bounded).
- ``jobs.sweep_id``: the sweep a job is one configuration of (None: a job of its own).
- ``sweeps``: a budgeted search over configurations by successive halving (bot/engine/control/sweeps.py): its
  request and grid, the stages planned, the runs with their per-run caps, its state and winner.

Revision ID: 0015_i31
Revises: 0014_i28a
Create Date: 2026-12-04 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_i31"
down_revision = "0014_i28a"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("results", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("sweep_id", sa.String(length=64), nullable=True))
        batch.create_index("ix_jobs_sweep_id", ["sweep_id"])
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(length=64), primary_key=True),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("team", sa.String(), nullable=True),
        sa.Column("channel", sa.String(), nullable=True),
        sa.Column("thread_ts", sa.String(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("message", sa.String(), nullable=True),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("grid", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("runs", sa.JSON(), nullable=False),
        sa.Column("max_cost", sa.Float(), nullable=False),
        sa.Column("estimated_cost", sa.Float(), nullable=True),
        sa.Column("stage", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("winner", sa.String(length=64), nullable=True),
        sa.Column("approved_by", sa.String(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_sweeps_owner", "sweeps", ["owner"])
    op.create_index("ix_sweeps_state", "sweeps", ["state"])


def downgrade() -> None:
    op.drop_index("ix_sweeps_state", table_name="sweeps")
    op.drop_index("ix_sweeps_owner", table_name="sweeps")
    op.drop_table("sweeps")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_sweep_id")
        batch.drop_column("sweep_id")
        batch.drop_column("results")
