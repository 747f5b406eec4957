"""jobs.approved_cost: the spend accepted for a job, checked before a launch rents a pricier offer (issue 19)

Approval compared only the chosen offer's estimate, and a launch whose chosen offer had no capacity (or a
relaunch after a preemption) rented the next offer whatever it cost: a $1.44 job fell back to a $60/h H100
without asking. A job now records what was accepted: by a person, up to its cap; automatically (under
TUNEBOT_APPROVAL_ABOVE), up to the lower of its cap and that amount. A fallback projected above it waits for
approval again instead of being rented. NULL for older jobs: their cap is used.

Revision ID: 0007_i19
Revises: 0006_i19
Create Date: 2026-12-04 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_i19"
down_revision = "0006_i19"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("approved_cost", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("approved_cost")
