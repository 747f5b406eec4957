"""volumes.tracked, volumes.job_id: the owner of a volume tunebot created or attached (issue 19)

Before, a volume's owner was never recorded, so whoever clicked Delete counted as its owner, and the
engine deleted any volume a provider listed, tunebot's or not. A volume is now tracked (with its owner,
the job's owner, and the job) when tunebot created or attached it; only tracked volumes may be deleted
or kept, by their owner or an admin. Rows from before are untracked: tunebot never recorded them.

Revision ID: 0006_i19
Revises: 0005_i12
Create Date: 2026-12-04 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_i19"
down_revision = "0005_i12"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.add_column(sa.Column("tracked", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("job_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.drop_column("job_id")
        batch.drop_column("tracked")
