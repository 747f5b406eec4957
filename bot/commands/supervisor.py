"""Who supervises a job that a CLI command leaves active: one line says which, and there always is one.

A rented machine bills until something terminates it, and the supervisor (the scheduler's leader in `tunebot
serve`) is what does. So `tunebot launch` (and approve, resume, clone) ends with one of:

- ``--wait``: this command follows the job itself until it ends;
- a live supervisor (a fresh scheduler lease on this job database, bot/engine/watching/watch.py) watches it;
- none was alive: this command starts one, `tunebot serve --auto` in the background for the same database
  and data folder (the same environment and working directory, so the same `.env`), and waits until it holds
  the lease. Two commands starting one each at the same moment are safe: the scheduler's leader lease picks
  one, and an ``--auto`` supervisor that is not the leader leaves (as it does once no job has been active for
  5 minutes);
- ``TUNEBOT_START_SUPERVISOR=0``, or the start failed: a warning that nothing watches the job, and what to
  run.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.engine.record.jobstate import ACTIVE

START_WAIT_S = 120.0  # a cold start imports the bot and migrates the database: longer on a busy machine
LOG_NAME = "supervisor.log"


@dataclass(frozen=True)
class Started:
    pid: int
    log: Path
    process: Any = None  # the Popen (its exit is checked while waiting for the lease)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_background(settings: Any) -> Started:
    """`tunebot serve --auto` in its own session (it outlives this command), logging to the data folder.
    Its /healthz listens on a free port of 127.0.0.1 (a team's `tunebot serve` may hold 3000)."""
    folder = Path(settings.data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / LOG_NAME
    command = [sys.executable, "-P", "-m", "bot.cli", "serve", "--auto", "--host", "127.0.0.1"]
    command += ["--port", str(_free_port())]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return Started(process.pid, log, process)


def _holder(engine: Any) -> str | None:
    ctx = getattr(engine, "ctx", None)
    if ctx is None:
        return None
    from bot.engine.watching.watch import supervisor

    found = supervisor(ctx)
    return found.holder if found is not None else None


def supervision_line(engine: Any, view: Any, *, wait: bool, start: Any = None) -> tuple[str, str] | None:
    """(text, kind) of the one line that says who supervises ``view``'s job; None for a job that rents
    nothing (awaiting approval, final). May start a supervisor (``start``, default start_background)."""
    if view.state not in ACTIVE:
        return None
    if wait:
        return (
            "Supervisor: this command, until the job ends (--wait). Stopping it (Ctrl-C) leaves the job to a "
            "supervisor: one is started if none is alive.",
            "info",
        )
    if engine.supervised():
        holder = _holder(engine)
        who = f" (scheduler lease held by {holder})" if holder else ""
        return (f"Supervisor: the `tunebot serve` alive on this job database{who} watches the job.", "info")
    from bot.engine.watching.watch import UNWATCHED
    from bot.settings import get_settings

    settings = get_settings()
    if not settings.start_supervisor:
        return (f":warning: {UNWATCHED}", "warning")
    try:
        started = (start or start_background)(settings)
    except OSError as exc:
        return (f":warning: Could not start a supervisor ({exc.strerror or exc}). {UNWATCHED}", "warning")
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if engine.supervised():
            return (
                "Supervisor: none was alive on this job database, so one was started in the background "
                f"(`tunebot serve --auto`, pid {started.pid}, log {started.log}); it leaves 5 minutes after "
                "the last active job ends. For good: `tunebot serve` (docs/deploy.md).",
                "info",
            )
        process = started.process
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.5)
    return (
        f":warning: A supervisor was started in the background (pid {started.pid}) but holds no lease on "
        f"this job database yet: see {started.log}. {UNWATCHED}",
        "warning",
    )


__all__ = ["LOG_NAME", "START_WAIT_S", "Started", "start_background", "supervision_line"]
