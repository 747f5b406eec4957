"""jobs.progress_window: what the bot last read of a runner's progress object survives a restart (issue 12)

The supervisor remembers, per running job, the window of the progress object it last stored (digest,
first and last seq, newest runner timestamp) so that an unchanged object is not parsed again and a
changed one is parsed from its end. Kept only in process memory, a restarted bot re-read and
re-checked every object against the stored events: a 6 s first tick at 10,000 running jobs.

Revision ID: 0005_i12
Revises: 0004_i12
Create Date: 2026-12-03 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_i12"
down_revision = "0004_i12"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("progress_window", sa.String(length=96), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("progress_window")
