"""Rented hosts for the fake clouds: each instance really runs the runner image's entry point, as a rented GPU
host would, with ONLY what the provider API call carried.

A ``HostPool`` gives every created instance a fresh sandbox folder (its working directory, HOME and TMPDIR),
an environment made of a bare PATH plus the variables of the API call, and the command of the image: the
image's ENTRYPOINT (from ``images``; an unknown image fails like a failed pull) followed by the call's args.
An image given as a ``StockImage`` is a public PyTorch image: a Python of its own per host (a fresh venv that
sees torch and the ML libraries of ``site_packages`` but nothing of tunebot), first on PATH, with no package
index (PIP_NO_INDEX): what the runner needs must come with the create call, and whatever pip installs goes
into that host's venv only. Nothing of the bot's process is inherited, and the bot's files are out of reach: a
``sitecustomize`` loaded at start-up makes every path under ``bot_roots`` look absent (open, stat, listdir,
... answer "No such file or directory") and refuses network connections beyond 127.0.0.1. So a job works here
only if its spec and environment carry everything by URI - which is the point.

    pool = HostPool(tmp_path / "hosts", images={IMAGE: [".../tunebot-runner"]}, bot_roots=[tmp_path / "bot"])
    fake = FakeVast(hosts=pool)          # created instances run; preempt() SIGTERMs, delete kills
    pool.log(instance_id)                # the runner's stdout + stderr
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Loaded by every sandboxed Python process (PYTHONPATH=<sandbox>/boot): the host's view of the world.
SITECUSTOMIZE = r"""
import errno, ipaddress, json, os, socket, sys

_DENY = tuple(os.path.abspath(p) for p in json.loads(os.environ.get("TUNEBOT_SANDBOX_DENY", "[]")))


def _denied(path):
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False
    if not isinstance(path, str) or not path:
        return False
    full = os.path.abspath(path)  # no syscalls here: os.stat itself is guarded
    return any(full == root or full.startswith(root + os.sep) for root in _DENY)


def _absent(path):
    return FileNotFoundError(errno.ENOENT, "No such file or directory (not on this host)", os.fsdecode(path))


def _hook(event, args):
    if event in ("open", "os.listdir", "os.scandir", "os.chdir", "os.mkdir", "os.remove", "os.rename",
                 "os.rmdir", "os.symlink", "os.link", "os.truncate", "shutil.copyfile", "shutil.copytree",
                 "shutil.rmtree", "glob.glob", "os.utime", "os.chmod"):
        if args and isinstance(args[0], (str, bytes, os.PathLike)) and _denied(args[0]):
            raise _absent(args[0])


sys.addaudithook(_hook)


def _guard(fn):
    def wrapped(path, *a, **k):
        if isinstance(path, (str, bytes, os.PathLike)) and _denied(path):
            raise _absent(path)
        return fn(path, *a, **k)
    wrapped.__wrapped__ = fn
    return wrapped


os.stat = _guard(os.stat)
os.lstat = _guard(os.lstat)
os.access = _guard(os.access)

_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex


def _check(address):
    if isinstance(address, tuple) and address:
        host = str(address[0])
        try:
            ok = ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise OSError(errno.ENETUNREACH, f"this test host reaches 127.0.0.1 only, not {host}")


def _guarded_connect(self, address):
    _check(address)
    return _connect(self, address)


def _guarded_connect_ex(self, address):
    _check(address)
    return _connect_ex(self, address)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
"""


@dataclass(frozen=True)
class StockImage:
    """A stock PyTorch image: torch and the libraries importable, tunebot not; no ENTRYPOINT."""

    site_packages: tuple[str, ...]
    entrypoint: tuple[str, ...] = ()

    def prepare(self, root: Path) -> dict[str, str]:
        """The image's Python under ``root`` (a venv, no pip of its own: the libraries' pip runs in it); the
        environment the image sets."""
        import venv

        venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
        (site,) = (root / "lib").glob("python3*/site-packages")
        (site / "_stock_image.pth").write_text("".join(f"{p}\n" for p in self.site_packages))
        return {"PATH": f"{root / 'bin'}:/usr/local/bin:/usr/bin:/bin", "PIP_NO_INDEX": "1"}


@dataclass
class Host:
    instance_id: str
    sandbox: Path
    command: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    problem: str | None = None  # why it never started (unknown image)
    preempted: bool = False
    started_at: float = field(default_factory=time.time)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


def _source_path() -> list[str]:
    """The test run's own PYTHONPATH entries (none in CI: the installed package is the checkout)."""
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


class HostPool:
    def __init__(
        self,
        root: Path,
        *,
        images: dict[str, list[str] | StockImage],
        bot_roots: list[Path],
        grace_s: float = 60.0,
        destroy_grace_s: float = 2.0,
    ) -> None:
        """``grace_s``: a spot reclaim's notice (SIGTERM, then SIGKILL); ``destroy_grace_s``: a destroy's
        (0: it kills at once, as a real cloud's destroy does: nothing the runner does on its way out
        survives)."""
        self.root = Path(root)
        self.images = images
        self.bot_roots = [str(Path(p).resolve()) for p in bot_roots]
        self.grace_s = grace_s
        self.destroy_grace_s = destroy_grace_s
        self.hosts: dict[str, Host] = {}
        self.lock = threading.Lock()

    # -- what a provider create call does ---------------------------------------------------------------
    def start(self, instance_id: str, *, image: str, args: list[str] | None, env: dict[str, str]) -> Host:
        sandbox = self.root / f"host-{instance_id}"
        for sub in ("home", "tmp", "boot", "work"):
            (sandbox / sub).mkdir(parents=True, exist_ok=True)
        (sandbox / "boot" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        found = self.images.get(image)
        image_env: dict[str, str] = {}
        if isinstance(found, StockImage):
            image_env = found.prepare(sandbox / "image")
            entry: list[str] | None = list(found.entrypoint)
        else:
            entry = found
        host_env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(sandbox / "home"),
            "TMPDIR": str(sandbox / "tmp"),
            "LANG": "C.UTF-8",
            # The sandbox's boot first; then the source the tests run (PYTHONPATH=<checkout>, a worktree whose
            # code is not the installed one): the image is built from that source, so the host runs it too.
            "PYTHONPATH": os.pathsep.join([str(sandbox / "boot"), *_source_path()]),
            "PYTHONUNBUFFERED": "1",
            # A fake host is a process on the tests' shared cores, not a machine of its own: one OpenMP
            # thread, as every test process has (tests/conftest.py). Two threads spinning against the other
            # xdist worker's runners made a 1,500-step tiny run take 8 minutes instead of 40 s.
            "OMP_NUM_THREADS": "1",
            "TUNEBOT_SANDBOX_DENY": json.dumps(self.bot_roots),
            **image_env,
            **{k: str(v) for k, v in env.items()},  # the API call's environment, as the cloud passes it
        }
        command = [*(entry or []), *(args or [])]
        host = Host(instance_id, sandbox, command, host_env)
        with self.lock:
            self.hosts[instance_id] = host
        if found is None:
            host.problem = f"pull access denied for {image}"
            return host
        with open(sandbox / "runner.log", "wb") as log:
            host.proc = subprocess.Popen(
                command,
                cwd=sandbox / "work",
                env=host_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return host

    def preempt(self, instance_id: str) -> None:
        """A spot reclaim: SIGTERM, then SIGKILL after the grace period; returns once the process is gone."""
        host = self.hosts[instance_id]
        host.preempted = True
        self._stop(host, self.grace_s)

    def destroy(self, instance_id: str) -> None:
        host = self.hosts.get(instance_id)
        if host is not None:
            self._stop(host, self.destroy_grace_s)

    def _stop(self, host: Host, grace_s: float) -> None:
        if not host.running:
            return
        assert host.proc is not None
        if grace_s <= 0:
            os.killpg(host.proc.pid, signal.SIGKILL)
            host.proc.wait(10)
            return
        host.proc.send_signal(signal.SIGTERM)
        try:
            host.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(host.proc.pid, signal.SIGKILL)
            host.proc.wait(10)

    # -- for the test ----------------------------------------------------------------------------------
    def log(self, instance_id: str) -> str:
        try:
            return (self.hosts[instance_id].sandbox / "runner.log").read_text(errors="replace")
        except (KeyError, OSError):
            return ""

    def close(self) -> None:
        for host in list(self.hosts.values()):
            if host.running and host.proc is not None:
                os.killpg(host.proc.pid, signal.SIGKILL)
                host.proc.wait(10)
