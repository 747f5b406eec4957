"""bot_secrets: the master key of the per-job integrity keys, shared by every replica (issue 19)

Each job's runner signs its progress events and checkpoint manifests with a key derived from a bot master
key and the job id (bot/engine/launching/integrity.py). The master key comes from TUNEBOT_SECRET_KEY; without
it, one is made at first use and kept here, so that every replica on this database derives the same job keys.

Revision ID: 0008_i19
Revises: 0007_i19
Create Date: 2026-12-03 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_i19"
down_revision = "0007_i19"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bot_secrets",
        sa.Column("name", sa.String(length=64), primary_key=True),
        sa.Column("value", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("bot_secrets")
