"""jobs.credentials_issued_at / credentials_expire_at: runners' storage credentials are renewed (issue 19)

A runner gets storage credentials scoped to its job and short-lived (bot/storage/credentials.py). The bot
renews them at half-life while the job runs (bot/storage/renewal.py): it needs to know, per job, when the
current ones were made and when they expire.

Revision ID: 0011_i19
Revises: 0010_i20
Create Date: 2026-12-03 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_i19"
down_revision = "0010_i20"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("credentials_issued_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("credentials_expire_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("credentials_expire_at")
        batch.drop_column("credentials_issued_at")
