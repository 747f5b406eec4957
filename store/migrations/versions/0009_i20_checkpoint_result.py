"""jobs.last_checkpoint_uri / last_checkpoint_step: the newest usable checkpoint of a job (issue 20)

A job stopped by its owner or its budget, or one that failed, has no output folder; its newest complete
checkpoint is its result (a loadable PEFT adapter or model) and what `/tune resume` continues from. The
runner announces checkpoints in its events; the finish confirms the newest one by listing the storage.

Revision ID: 0009_i20
Revises: 0008_i19
Create Date: 2026-12-03 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_i20"
down_revision = "0008_i19"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("last_checkpoint_uri", sa.String(), nullable=True))
        batch.add_column(sa.Column("last_checkpoint_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("last_checkpoint_step")
        batch.drop_column("last_checkpoint_uri")
