"""job_runs.pruned_at: when the bot deleted a superseded run's folder (bot/engine/watching/pruning.py)

Each run writes under ``<job folder>/runs/<run id>/``. Once a newer run of the job exists and the old run's
storage credentials have expired, the bot deletes that folder except what it pinned (the checkpoints the job
resumes from, the results) and records when here, so the run is never listed again.

Revision ID: 0016_i30f
Revises: 0015_i31
Create Date: 2026-12-04 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_i30f"
down_revision = "0015_i31"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_runs") as batch:
        batch.add_column(sa.Column("pruned_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_runs") as batch:
        batch.drop_column("pruned_at")
