"""Errors the planner raises; every message is safe to show a person (no traceback, no secrets).

PlanningError (ValueError)
 +-- UnknownModelError      model name not in the table, not a file, not fetchable
 +-- BadRequestError        numbers out of range, unknown GPU, conflicting options
"""

from __future__ import annotations


class PlanningError(ValueError):
    """A request the planner cannot answer; the message says why in plain words."""


class UnknownModelError(PlanningError):
    """The model could not be resolved; `.suggestions` holds the closest known names."""

    def __init__(self, message: str, suggestions: list[str] | None = None) -> None:
        super().__init__(message)
        self.suggestions = list(suggestions or [])


class BadRequestError(PlanningError):
    """A request option is out of range or conflicts with another one."""
