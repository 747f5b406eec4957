"""Prewarmed local runner starts: forked from a process that has already imported torch (runner/prewarm.py).

A local runner started as ``python -P -m runner.cli`` spends seconds of CPU importing torch, transformers
and peft before its first step; the local provider asks a prewarmed process to fork it instead, laid out
exactly as the shell wrapper lays one out (a keeper in its own session, the runner's pid and exit status in
files). One prewarmed process serves one *import environment*: the launch's environment without a run's
own values (TUNEBOT_*, AWS_*, tokens and keys), which libraries do not read at import and which must never
sit in a process that outlives the run. A launch whose import environment differs (another HF_ENDPOINT,
another thread count) gets its own process, so what a library read at import is what a fresh runner would
have read. The second launch in an environment (or ``warm``) starts its process, and launches fork once it
is ready; until then they start the plain way (a launch never waits for torch to import). The processes end
with the bot (their stdin closes) or after IDLE_S without a start, and at most MAX_PROCESSES live at once.
Anything that goes wrong here falls back to the plain start (``start`` -> None).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

IDLE_S = 600.0  # a prewarmed process with no start for this long ends (it holds the libraries' memory)
MAX_PROCESSES = 2
START_TIMEOUT_S = 30.0
RUN_ONLY_PREFIXES = ("TUNEBOT_", "AWS_")  # a run's spec, keys, callback and credentials
RUN_ONLY_NAMES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY"})


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a prewarmed process may hold: the environment without a run's own values."""
    return {k: v for k, v in env.items() if not k.startswith(RUN_ONLY_PREFIXES) and k not in RUN_ONLY_NAMES}


class _Warm:
    """One prewarmed process, listening on a Unix socket in a folder only this user may enter."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tunebot-prewarm-"))  # mode 0700
        self.socket_path = str(self.folder / "s")
        self.proc = subprocess.Popen(
            [python, "-P", "-m", "runner.prewarm", self.socket_path, str(IDLE_S)],
            stdin=subprocess.PIPE,  # closed when the bot ends: the process ends with it
            stdout=subprocess.PIPE,
            bufsize=0,  # unbuffered: what select() says is readable is all there is to read
            stderr=subprocess.DEVNULL,
            cwd=self.folder,
            env=env,
            start_new_session=True,
        )
        self.ready = False
        self.failed = False  # ended before it was ready: no second try for this environment
        self.last_used = time.monotonic()

    def is_ready(self) -> bool:
        """Whether it has said it is ready (never waits: a launch does not wait for torch to import). A
        library may print a line of its own while it is imported: only "ready" counts."""
        assert self.proc.stdout is not None
        while not self.ready and not self.failed:
            said, _, _ = select.select([self.proc.stdout], [], [], 0)
            if not said:
                break
            line = self.proc.stdout.readline()
            self.ready = line.strip() == b"ready"
            self.failed = not line  # it ended before it was ready
        return self.ready and self.proc.poll() is None

    def alive(self) -> bool:
        return self.proc.poll() is None and time.monotonic() - self.last_used < IDLE_S - 5.0

    def start(self, request: dict[str, object]) -> int:
        self.last_used = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(START_TIMEOUT_S)
            conn.connect(self.socket_path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            with conn.makefile("rb") as stream:
                answer = json.loads(stream.readline() or b"{}")
        if "pid" not in answer:
            raise OSError(answer.get("error", "no answer"))
        return int(answer["pid"])

    def stop(self) -> None:
        """Ends it: a ready one leaves when its stdin closes; one still importing is killed (no exit waits
        for torch to finish importing)."""
        if not self.ready:
            self.proc.kill()
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Prewarmed:
    """The prewarmed processes of this bot process, one per import environment (see the module's doc)."""

    def __init__(self, python: str) -> None:
        self.python = python
        self._warm: OrderedDict[tuple[tuple[str, str], ...], _Warm] = OrderedDict()
        self._failed: set[tuple[tuple[str, str], ...]] = set()
        self._plain: dict[tuple[tuple[str, str], ...], int] = {}  # plain starts so far, per environment
        self._lock = threading.Lock()

    def _ready(self, env: dict[str, str], *, warm_up: bool) -> _Warm | None:
        """The ready process for this environment, or None. A start that finds none counts as a plain one;
        the process is started by ``warm_up`` or by the second plain start (a CLI command that launches once
        never pays for one). A replaced or dead one is forgotten; one that died before it was ready is not
        tried again."""
        key = tuple(sorted(env.items()))
        with self._lock:
            if key in self._failed:
                return None
            warm = self._warm.get(key)
            if warm is not None and warm.is_ready() and warm.alive():
                self._warm.move_to_end(key)
                return warm
            if warm is not None and (warm.failed or not warm.alive()):
                if warm.failed:
                    self._failed.add(key)
                    log.warning("the prewarmed runner process did not start; runners start the plain way")
                self._warm.pop(key).stop()
                warm = None
            if warm is None and (warm_up or self._plain.get(key, 0) >= 1):
                self._warm[key] = _Warm(self.python, env)
                while len(self._warm) > MAX_PROCESSES:
                    self._warm.popitem(last=False)[1].stop()
            if not warm_up:
                self._plain[key] = self._plain.get(key, 0) + 1
            return None

    def ready(self, env: Mapping[str, str]) -> bool:
        """Whether a runner started now in this environment forks from a ready process (never starts one:
        the local provider's offer asks, and prices the start it will get)."""
        key = tuple(sorted(import_env(env).items()))
        with self._lock:
            warm = self._warm.get(key)
            return warm is not None and warm.is_ready() and warm.alive()

    def pids(self) -> list[int]:
        """The prewarmed processes' pids (not the runners forked from them): tunebot's own work, which the
        local offer does not count as other programs' load on the cores."""
        with self._lock:
            return [w.proc.pid for w in self._warm.values()]

    def launches_until_warming(self, env: Mapping[str, str]) -> int | None:
        """How many launches from now start the plain way before one also starts this environment's prewarmed
        process, which imports the libraries beside those runners' own imports (0: the next launch does; the
        local provider's quote prices that importer). None where none will be started: one is there
        (ready or importing already), or one failed here."""
        key = tuple(sorted(import_env(env).items()))
        with self._lock:
            if key in self._failed or key in self._warm:
                return None
            return 0 if self._plain.get(key, 0) >= 1 else 1

    def warm(self, env: Mapping[str, str]) -> None:
        """Start this environment's process now (a process that knows it will start several runners)."""
        self._ready(import_env(env), warm_up=True)

    def start(
        self,
        *,
        args: list[str],
        env: Mapping[str, str],
        cwd: Path,
        log_file: Path,
        pid_file: Path,
        exit_file: Path,
    ) -> int | None:
        """The keeper's pid (its session's leader; the runner's pid is in ``pid_file``), or None: start the
        runner the plain way (see ``_ready`` for when the prewarmed process is started)."""
        warm = self._ready(import_env(env), warm_up=False)
        if warm is None:
            return None
        request = {
            "args": args,
            "env": dict(env),
            "cwd": str(cwd),
            "log": str(log_file),
            "pid_file": str(pid_file),
            "exit_file": str(exit_file),
        }
        try:
            return warm.start(request)
        except (OSError, ValueError) as exc:
            log.warning("prewarmed runner start failed (%s); starting the runner the plain way", exc)
            return None

    def stop(self) -> None:
        with self._lock:
            while self._warm:
                self._warm.popitem()[1].stop()


_shared: tuple[int, Prewarmed] | None = None
_shared_lock = threading.Lock()


def shared(python: str) -> Prewarmed:
    """This process's prewarmed starts (a forked bot gets its own)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid() or _shared[1].python != python:
            _shared = (os.getpid(), Prewarmed(python))
            atexit.register(_shared[1].stop)
        return _shared[1]
