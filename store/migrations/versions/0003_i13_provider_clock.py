"""billing from the provider's clock: instances.created_at, jobs.launch_requested_at (issue 13)

Revision ID: 0003_i13
Revises: 0002_i11
Create Date: 2026-12-03 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_i13"
down_revision = "0002_i11"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER TABLE ... ADD COLUMN inside every construct; nullable columns only
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("created_at", sa.Float(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("launch_requested_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("launch_requested_at")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("created_at")
