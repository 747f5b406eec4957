"""engine indexes for summaries and budgets at 100k jobs (issue 12)

The daily summary and the budget checks are aggregates over one period of the ledger, grouped by
owner or provider, and a count of the jobs finished in a day by state: covering indexes make each a
range scan of an index instead of a scan of the table.

Revision ID: 0004_i12
Revises: 0003_i13
Create Date: 2026-12-03 12:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0004_i12"
down_revision = "0003_i13"  # chained after issue 13's (rebased onto it)
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_spend_period_owner_amount", "spend_ledger", ["period_start", "owner", "amount"]),
    ("ix_spend_period_provider_amount", "spend_ledger", ["period_start", "provider", "amount"]),
    ("ix_spend_owner_period_amount", "spend_ledger", ["owner", "period_start", "amount"]),
    ("ix_spend_team_period_amount", "spend_ledger", ["team", "period_start", "amount"]),
    ("ix_jobs_finished_state", "jobs", ["finished_at", "state"]),
    ("ix_instances_open_job", "instances", ["ended_at", "job_id"]),
)


def upgrade() -> None:
    for name, table, cols in INDEXES:
        op.create_index(name, table, cols, unique=False)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
