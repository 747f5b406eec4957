"""jobs.disk_gb and jobs.start_deadline_s: what a launch asks of a host, decided before renting (issue 20)

``disk_gb``: the disk sized from the model, checkpoints, data and outputs (bot/planner/disk.py), passed
to every provider's create call (it was a flat 100 GB). ``start_deadline_s``: how long a new instance
may take to start the runner (image pull + model download at a stated bandwidth + a margin,
bot/engine/launching/preflight.py) before it is given up on, instead of twice the heartbeat timeout.

Revision ID: 0010_i20
Revises: 0009_i20
Create Date: 2026-12-04 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_i20"
down_revision = "0009_i20"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("disk_gb", sa.Float(), nullable=True))
        batch.add_column(sa.Column("start_deadline_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("start_deadline_s")
        batch.drop_column("disk_gb")
