"""job_runs, run_checkpoints, jobs.run_id and the bot's Hub push (issue 28, part A)

Each launch of a job is a run with its own key, folder and storage credentials (bot/engine/record/runs.py);
the bot accepts what a run signs only while it is the job's current run (``jobs.run_id``). A checkpoint counts
only when the bot acknowledged it from its run's signed event (``run_checkpoints``, with the manifest's
digest). The Hub push moved to the bot (``jobs.hub_state``, ``hub_claimed_at``, ``hub_url``).

A job launched before this revision and still launching or running keeps its job-wide key until that
launch ends: its current run is named ``legacy`` (bot/engine/launching/integrity.py). Every later launch is a
run.

Revision ID: 0014_i28a
Revises: 0013_i28b
Create Date: 2026-12-20 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_i28a"
down_revision = "0013_i28b"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_runs",
        sa.Column("id", sa.String(length=64), primary_key=True),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("end_reason", sa.String(), nullable=True),
        sa.Column("instance", sa.String(), nullable=True),
        sa.Column("resume", sa.JSON(), nullable=False),
        sa.Column("output_uri", sa.String(), nullable=True),
        sa.Column("output_manifest_sha256", sa.String(length=64), nullable=True),
    )
    op.create_index("ix_job_runs_job_id", "job_runs", ["job_id"])
    op.create_table(
        "run_checkpoints",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("uri", sa.String(), nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("acknowledged_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("job_id", "run_id", "step", name="uq_run_checkpoint_step"),
    )
    op.create_index("ix_run_checkpoints_job_id", "run_checkpoints", ["job_id"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("run_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("hub_state", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("hub_claimed_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("hub_url", sa.String(length=300), nullable=True))
    jobs = sa.table("jobs", sa.column("state", sa.String()), sa.column("run_id", sa.String()))
    op.get_bind().execute(
        jobs.update().where(jobs.c.state.in_(["launching", "running"])).values(run_id="legacy")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("hub_url")
        batch.drop_column("hub_claimed_at")
        batch.drop_column("hub_state")
        batch.drop_column("run_id")
    op.drop_index("ix_run_checkpoints_job_id", table_name="run_checkpoints")
    op.drop_table("run_checkpoints")
    op.drop_index("ix_job_runs_job_id", table_name="job_runs")
    op.drop_table("job_runs")
