"""Named crash points in the launch, relaunch, recovery and finish sequences, for the SIGKILL crash test.

``crashpoint("launch.after_claim")`` kills this very process (SIGKILL: no cleanup, no finally)
when the environment variable TUNEBOT_CRASH_AT names it. In production the variable is unset and a
crash point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS: tuple[str, ...] = (
    "launch.after_claim",
    "launch.after_run_started",
    "relaunch.after_run_started",
    "launch.after_provider_create",
    "launch.after_commit",
    "recover.after_mark",
    "recover.after_terminate",
    "finish.before_terminate",
    "finish.after_terminate",
    "finish.after_commit",
)


def crashpoint(name: str) -> None:
    target = os.environ.get("TUNEBOT_CRASH_AT")
    if target and name in target.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
