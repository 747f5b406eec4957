"""A prewarmed runner start: a process that has imported the training libraries forks each local runner.

Importing torch, transformers and peft takes a fresh runner seconds of CPU before its first step; a local
runner started by forking this process skips that. Started by the bot's local provider as
``python -P -m runner.prewarm SOCKET IDLE_SECONDS`` with the environment every runner it serves shares
(bot/providers/prewarm.py: a run's own values, its spec, keys and credentials, never reach this process);
it imports the libraries, listens on SOCKET (a Unix socket in a folder only its user may enter) and, per
request, forks a process laid out as the shell wrapper of bot/providers/local.py lays one out:

- the *keeper*, leader of a new session, with the runner's files, folder and environment: forks the
  runner, writes the runner's pid to the pid file, waits
  for it and writes its exit status to the exit file atomically (128 + N when a signal N ended it, as
  ``sh``'s ``wait`` reports it), then exits;
- the *runner*, which inherits them: stdin from /dev/null, stdout and stderr appended to the instance's
  log, the request's working directory and its whole environment, default signal handlers; it runs
  ``runner.cli`` as ``python -m`` would and exits through the interpreter's normal shutdown.

Only libraries are imported here, never a ``runner`` module that reads the environment: what a module reads
from the environment when it is imported (the Hub's endpoint, offline mode, thread counts) is the same as a
fresh runner's, because the provider keeps one such process per environment. It exits when its parent
closes its stdin (the bot ended) or after IDLE_SECONDS with no request.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, NoReturn

# What a runner imports before its first step (runner/train.py, runner/model.py), heaviest first.
PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "peft", "accelerate", "safetensors.torch")
MODULE = "runner.cli"  # the only thing this process starts
READY = "ready"  # the first line on stdout once the libraries are imported and the socket listens
MAX_REQUEST_BYTES = 8 << 20  # a request carries a job's spec in its environment: a few KB, bounded anyway


@dataclass(frozen=True)
class Start:
    """One runner to start: what ``python -P -m runner.cli ARGS`` would get from the local provider."""

    args: list[str]
    env: dict[str, str]
    cwd: str
    log: str
    pid_file: str
    exit_file: str

    @classmethod
    def parse(cls, line: bytes) -> Start:
        raw: Any = json.loads(line)
        return cls(
            args=[str(a) for a in raw["args"]],
            env={str(k): str(v) for k, v in raw["env"].items()},
            cwd=str(raw["cwd"]),
            log=str(raw["log"]),
            pid_file=str(raw["pid_file"]),
            exit_file=str(raw["exit_file"]),
        )


def preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # the runner reports a missing library in its own words
            importlib.import_module(name)


def exit_status(status: int) -> int:
    """A wait status as ``sh``'s ``wait`` reports it: the exit code, or 128 + the signal's number."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def become_runner(start: Start, log_fd: int) -> None:
    """In the runner's process: its files, folder, environment and signal handlers, as a fresh start has."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    os.chdir(start.cwd)
    os.environ.clear()
    os.environ.update(start.env)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def keep(start: Start, ready_fd: int, server_fds: list[int]) -> Start:
    """In the keeper's process (a new session, laid out as the runner will be, as the shell wrapper is):
    start the runner, say its pid is on disk, wait for it and record how it ended. Returns only in the
    runner's process; the keeper ends here."""
    try:
        os.setsid()
        become_runner(start, os.open(start.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        pid = os.fork()
    except BaseException:
        os._exit(1)
    if pid == 0:
        os.close(ready_fd)
        return start
    try:
        for fd in server_fds:  # the listening socket and the connection are the server's
            os.close(fd)
        write_atomically(start.pid_file, f"{pid}\n")
        os.write(ready_fd, b"1")
        os.close(ready_fd)
        _, status = os.waitpid(pid, 0)
        write_atomically(start.exit_file, f"{exit_status(status)}\n")
    finally:
        os._exit(0)


def fork_keeper(start: Start, server_fds: list[int]) -> tuple[int, Start | None]:
    """In the server: the keeper's pid once the runner's pid is on disk. In the runner: (0, start)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        return 0, keep(start, write_fd, server_fds)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as ready:
        if not ready.read(1):  # the keeper ended before the runner's pid was written
            raise OSError("the keeper process ended at once")
    return pid, None


def reply(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def answer(conn: socket.socket, listener: socket.socket) -> Start | None:
    """Serve one request; returns a Start only in the forked runner's process."""
    with conn, conn.makefile("rb") as stream:
        try:
            line = stream.readline(MAX_REQUEST_BYTES)
            if not line.endswith(b"\n"):
                raise ValueError(f"no request line within {MAX_REQUEST_BYTES} bytes")
            start = Start.parse(line)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            reply(conn, {"error": f"bad request: {exc}"})
            return None
        try:
            pid, child = fork_keeper(start, [listener.fileno(), conn.fileno(), sys.stdin.fileno()])
        except OSError as exc:
            reply(conn, {"error": f"cannot start: {exc}"})
            return None
        if child is not None:
            return child
        reply(conn, {"pid": pid})
    return None


def serve(path: str, idle_s: float) -> Start | None:
    """Answer requests until the parent goes away or nothing comes for ``idle_s``; a Start in a runner."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel as they exit
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print(READY, flush=True)
    server = os.getpid()
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s:
            readable, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
                return None  # the bot closed our stdin: it ended
            if listener in readable:
                conn, _ = listener.accept()
                last = time.monotonic()
                start = answer(conn, listener)
                if start is not None:  # in the runner's process
                    listener.close()
                    return start
        return None
    finally:
        if os.getpid() == server:  # the runner's copy of this frame must not remove the server's socket
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)


def run_runner(start: Start) -> NoReturn:
    """``python -m runner.cli ARGS`` in this process: its exit code, traceback and shutdown as a fresh one."""
    sys.argv = [MODULE, *start.args]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def main() -> None:
    path, idle_s = sys.argv[1], float(sys.argv[2])
    preload()
    start = serve(path, idle_s)
    if start is not None:
        run_runner(start)


if __name__ == "__main__":
    main()
