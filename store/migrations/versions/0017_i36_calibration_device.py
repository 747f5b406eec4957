"""calibration_runs.device: the CPU a local run had (its cores, the runs sharing them, its threads, its Python
speed), so the physics predicts the run on the CPU it ran on (issue 36).

A run on this machine's CPU is quoted for the share of the cores it gets and the machine's measured Python
speed (bot/planner/plan.cpu_share). Its measurement was predicted on the nominal CPU instead (two cores to
itself, the development machine's speed), so a run that went exactly as quoted read as half the physics'
speed, and calibration then doubled every later local quote. None for a GPU's row, an import, or a row
recorded before.

Revision ID: 0017_i36
Revises: 0016_i30f
Create Date: 2026-12-07 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_i36"
down_revision = "0016_i30f"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calibration_runs") as batch:
        batch.add_column(sa.Column("device", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calibration_runs") as batch:
        batch.drop_column("device")
