"""`tunebot-runner` entry point (filled in by the runner)."""

from __future__ import annotations


def main() -> None:
    raise SystemExit("not implemented yet")
