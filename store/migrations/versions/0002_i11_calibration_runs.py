"""calibration runs: finished runs' measurements for the planner (issue 11)

Revision ID: 0002_i11
Revises: 0001
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0002_i11"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calibration_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("recorded_at", sa.Float(), nullable=False),
        sa.Column("gpu", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("max_memory_reserved_gb", sa.Float(), nullable=True),
        sa.Column("device_memory_used_gb", sa.Float(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("mfu", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id"),
    )
    with op.batch_alter_table("calibration_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_calibration_runs_gpu"), ["gpu"], unique=False)
        batch_op.create_index(batch_op.f("ix_calibration_runs_recorded_at"), ["recorded_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("calibration_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_calibration_runs_recorded_at"))
        batch_op.drop_index(batch_op.f("ix_calibration_runs_gpu"))
    op.drop_table("calibration_runs")
