"""The job states (docs/ARCHITECTURE.md, Jobs): one StrEnum for the engine, the store, the chat and the CLI.

A module without imports, so that anything may use it without loading the database layer. Which
transitions exist is bot/engine/record/states.py's; which states count as what is here.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING_APPROVAL = "pending_approval"
    APPROVED = "approved"
    LAUNCHING = "launching"
    RUNNING = "running"
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"


# What the engine supervises: it may be renting (or about to rent) a machine.
ACTIVE = frozenset({JobState.APPROVED, JobState.LAUNCHING, JobState.RUNNING, JobState.RECOVERING})
# Nothing more happens to it.
FINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED})
# Not finished yet, awaiting approval included: what a person calls an active job (the chat's "your
# active jobs", `tunebot jobs --active`, the Stop button).
OPEN = frozenset(JobState) - FINAL
# Renting a machine, or about to (approved excluded: it has not asked for one yet): what counts against
# a person's running-job limit while a job launches.
RENTING = ACTIVE - {JobState.APPROVED}


def resumable(state: str, stop_reason: str | None) -> bool:
    """A job `resume` can continue: stopped (by its owner, its budget, idleness, a price rise) or failed. A
    plateau stop ended on purpose with its output saved; a cancelled job never ran (clone it instead)."""
    return state == JobState.FAILED or (state == JobState.STOPPED and stop_reason != "plateau")
