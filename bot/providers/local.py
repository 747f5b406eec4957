"""LocalProvider: runs ``tunebot-runner`` as a process on this machine, with a cloud's lifecycle.

The embedded default for the demo and the tests. Each instance is a process in its own session
(so it outlives a crashed bot, like a real cloud instance would), started by a tiny ``sh`` wrapper
that records the runner's pid and, when it ends, its exit code in files. Instances are persisted in
a JSON state file under the work dir, so a new LocalProvider in a new bot process lists, inspects
and terminates what an earlier one started.

Per instance, under ``<workdir>/instances/<instance_id>/``: ``runner.log`` (stdout+stderr) and
``exit_code`` (written when the runner exits; 75 = preempted by SIGTERM, reported as ``exited``).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.planner.offer import Offer
from bot.providers import prewarm, start_readings
from bot.providers.base import (
    Capabilities,
    Instance,
    InstanceStatus,
    InvalidRequestError,
    LaunchRequest,
    NotFoundError,
    OfferQuery,
    Volume,
    redact,
)
from bot.providers.common import finish_search
from bot.providers.host_speed import python_speed, save_reading

# The runner as a module, in its instance's own folder and with -P (no current directory on sys.path): a file
# in the bot's working directory named like a module (runner.py, torch.py) never shadows the real one.
DEFAULT_RUNNER_COMMAND: tuple[str, ...] = (sys.executable, "-P", "-m", "runner.cli")
# What a runner process inherits from the bot's environment: an allow-list (the system, Python, caches and
# the ML libraries' offline/thread switches), never the bot's secrets. Everything else it needs comes in
# LaunchRequest.env, as on a rented host (the spec, storage credentials, the read-only Hub token when needed).
INHERITED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TRANSFORMERS_CACHE",
        "HF_HUB_DISABLE_TELEMETRY",
        "TORCH_HOME",
        "TOKENIZERS_PARALLELISM",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "WANDB_MODE",
        "WANDB_DIR",
        "WANDB_SILENT",
        "MPLBACKEND",
        "TUNEBOT_CPU_PROCESSES",
    }
)
_PUBLIC_ENV = frozenset({"TUNEBOT_JOB_SPEC", "HF_ENDPOINT", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"})
INHERITED_PREFIXES = ("LC_", "TUNEBOT_TEST_")  # locale; the runner's test hooks (runner/checkpoint.py)


def inherited_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The part of the bot's environment a local runner process gets (an allow-list)."""
    return {k: v for k, v in environ.items() if k in INHERITED_ENV or k.startswith(INHERITED_PREFIXES)}


# What the runner imports to train (runner/model.py, runner/train.py): without them a local job would start
# and die at once (a bot-only install, `pip install .` without the [runner] extra).
RUNNER_IMPORTS = ("torch", "transformers", "peft", "accelerate", "safetensors")
RUNNER_EXTRA_HINT = "pip install 'tunebot[runner]' on this machine to train here"


def runner_missing(modules: Sequence[str] = RUNNER_IMPORTS) -> str | None:
    """Why the runner cannot start on this machine (the modules it needs that this Python cannot import),
    or None. Asked of the import system without importing anything: the bot never imports torch."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a module stubbed out, a broken package
            found = None
        if found is None:
            missing.append(name)
    if not missing:
        return None
    return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed ({RUNNER_EXTRA_HINT})"


class BusyCores:
    """How many of this machine's cores other work keeps busy now: the CPU time /proc/stat counts (user,
    nice, system, irq, softirq, steal; not idle, not iowait) over the wall time since the last look (0.2-2 s
    ago; a first look, or an older one, samples 0.2 s: a window reaching back further still held the run that
    just ended, and a run quoted right after it got half the threads and a quote twice its run), less what
    tunebot's own passing work took meanwhile (``own_pids``: this process and its prewarmed processes; the
    prewarmed process importing torch read as a busy core, and a sweep quoted then was priced for five runs
    sharing the cores where four did, x0.57). The load average is no measure of it: it counts tasks waiting
    on I/O, and a busy test run's short-lived processes, that take no core from a run (measured: a one-thread
    run kept ~0.8 of a core at load 4 on 2 cores). 0 where /proc/stat cannot be read."""

    MIN_S, MAX_S = 0.2, 2.0

    def __init__(self, own_pids: Callable[[], list[int]] | None = None) -> None:
        self._last: tuple[float, float, float] | None = None  # (monotonic, busy, total) jiffies
        self._own_pids = own_pids or (lambda: [])

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [float(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        own = sum(_cpu_jiffies(pid) for pid in {os.getpid(), *self._own_pids()})
        return time.monotonic(), sum(fields[:8]) - idle - own, sum(fields[:8])

    def cores(self) -> float:
        now = self._sample()
        if now is None:
            return 0.0
        last = self._last
        if last is None or not (self.MIN_S <= now[0] - last[0] <= self.MAX_S):
            time.sleep(self.MIN_S)
            last, now = now, self._sample() or now
        self._last = now
        total = now[2] - last[2]
        return max(0.0, machine_cores() * (now[1] - last[1]) / total) if total > 0 else 0.0


def _prewarm_pids() -> list[int]:
    return prewarm.shared(sys.executable).pids()


def _cpu_jiffies(pid: int) -> float:
    """A process's CPU time so far (user + system, all its threads), in /proc/stat's clock ticks; 0 when it
    is gone."""
    fields = _proc_stat(pid)
    try:
        return float(fields[11]) + float(fields[12]) if fields else 0.0  # fields 14 and 15 overall
    except (IndexError, ValueError):
        return 0.0


def machine_cores() -> int:
    """The cores this process may run on (its affinity), which its runners share."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


FORGET_TERMINATED_AFTER_S = 7 * 24 * 3600.0  # terminated records kept a week (status answers "terminated")
KILLED_EXIT_CODE = 137  # recorded when the grace period ran out and we had to SIGKILL

# Runs "$@" in the background, records its pid, waits for it and writes its exit status atomically
# to $TUNEBOT_EXIT_FILE. Signals go straight to the runner's pid (a trap that forwards them can lose
# one that lands between fork and exec), so the wrapper itself needs no trap.
_WRAPPER = r"""
"$@" &
child=$!
echo "$child" > "$TUNEBOT_PID_FILE"
wait "$child"; rc=$?
echo "$rc" > "$TUNEBOT_EXIT_FILE.tmp" && mv "$TUNEBOT_EXIT_FILE.tmp" "$TUNEBOT_EXIT_FILE"
"""


def _proc_stat(pid: int) -> list[str] | None:
    """A pid's /proc/<pid>/stat fields after its command name (fields[0] is field 3, its state); None where
    the process is gone or /proc is missing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def _proc_start_ticks(pid: int) -> int | None:
    """The kernel's start time of a pid (guards against pid reuse); None where /proc is missing."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 overall
    except (IndexError, ValueError):
        return None


def _proc_state(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[0] if fields else None


class LocalProvider:
    """A provider whose "instances" are runner processes on this machine."""

    name = "local"
    capabilities = Capabilities(
        interruptible=False, volumes=False, kind="process", stop=False, burn_rate=True
    )
    # An instance here is the runner's own process: "running" means the runner lives (a cloud's "running" is
    # only its machine). The supervisor never declares such a runner dead for silence (issue 38).
    sees_runner_process = True

    def __init__(
        self,
        *,
        workdir: str | Path | None = None,
        runner_command: Sequence[str] | None = None,
        price_per_hour: float = 0.10,
        gpu_memory_gb: float = 16.0,
        extra_env: dict[str, str] | None = None,
        prewarm: bool | None = None,
    ) -> None:
        if workdir is None:
            from bot.settings import get_settings

            workdir = get_settings().data_dir / "local-provider"
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.runner_command = list(runner_command or DEFAULT_RUNNER_COMMAND)
        self.price_per_hour = price_per_hour
        self.gpu_memory_gb = gpu_memory_gb
        self.extra_env = dict(extra_env or {})
        self.prewarm = prewarm  # None: TUNEBOT_LOCAL_PREWARM (on unless 0)
        self._state_path = self.workdir / "instances.json"
        self._lock_path = self.workdir / "instances.lock"
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # ours to reap
        self._hidden: dict[str, list[str]] = {}  # instance id -> the values it got, scrubbed from its words
        self._busy = BusyCores(own_pids=_prewarm_pids)

    # -- state file (shared by every LocalProvider on this workdir, across processes) ---------------
    @contextlib.contextmanager
    def _state(self, *, write: bool = False) -> Iterator[dict[str, dict[str, Any]]]:
        """The state file under an exclusive lock; saved atomically afterwards when ``write``."""
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    state = json.loads(self._state_path.read_text())
                except (OSError, ValueError):
                    state = {}
                yield state
                if write:
                    tmp = self._state_path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
                    os.replace(tmp, self._state_path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def instance_dir(self, instance_id: str) -> Path:
        return self.workdir / "instances" / instance_id

    def log_path(self, instance_id: str) -> Path:
        """The runner's combined stdout/stderr."""
        return self.instance_dir(instance_id) / "runner.log"

    def exit_code_path(self, instance_id: str) -> Path:
        return self.instance_dir(instance_id) / "exit_code"

    def pid_path(self, instance_id: str) -> Path:
        return self.instance_dir(instance_id) / "runner.pid"

    # -- offers ------------------------------------------------------------------------------------
    def offer(self) -> Offer:
        """This machine's CPU, priced for what a run started now gets of it: its cores, what already runs on
        them (``runs_here``; ``cpu_busy``: the cores' worth the machine was busy on lately, other programs'
        work included), and whether the runner starts as a fork of a process that has its libraries."""
        runs = float(len(self.list_instances()))
        busy = self._cores_busy(runs)
        starts = self._start_readings()
        return Offer(
            provider=self.name,
            offer_id="local-cpu",
            gpu="cpu",
            gpu_count=1,
            gpu_memory_gb=self.gpu_memory_gb,
            price_per_hour=self.price_per_hour,
            reliability=None,
            location="this machine",
            boot_minutes=0.0,  # a process on this machine: no instance to boot, no image to pull
            cpu_cores=machine_cores(),
            runs_here=runs,
            cpu_busy=round(busy, 2),
            cpu_threads=self.threads(max(runs, busy)),
            warm_start=self._warm_start(),
            prewarm_after=self._prewarm_after(),
            cpu_speed=python_speed(self.workdir / "python-speed.json"),
            start_seconds=start_readings.typical(starts, forked=False),
            fork_seconds=start_readings.typical(starts, forked=True),
            source="live",
            as_of=datetime.now(UTC),
        )

    def threads(self, busy: float | None = None) -> int:
        """The threads a runner started now gets: its share of the cores that are not busy (this provider's
        runners, or what the machine was busy on lately when that says more). On a busy machine a run's
        spinning OpenMP threads would fight the others' for cores that are not there (several-fold slower
        steps, tests/conftest.py); one thread keeps about a core (measured: ~0.8 of one at load 4 on 2
        cores). OMP_NUM_THREADS, when set, wins."""
        for env in (self.extra_env, os.environ):
            if str(env.get("OMP_NUM_THREADS", "")).isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
                return int(env["OMP_NUM_THREADS"])
        if busy is None:
            runs = float(len(self.list_instances()))
            busy = max(runs, self._cores_busy(runs))
        return max(1, machine_cores() // max(1, round(busy) + 1))

    def _start_readings(self) -> list[dict[str, Any]]:
        """The starts of this machine's runners that have exited (bot/providers/start_readings.py), read once
        each from the summary that ends their logs, at a whole core."""
        with self._state() as state:
            records = list(state.values())
        finished = [
            self._finished_runner(rec)
            for rec in records
            if "forked" in rec and self.exit_code_path(rec["instance_id"]).exists()
        ]

        def spans() -> dict[str, tuple[float, float]]:  # asked only when a runner not read yet is read
            now = time.time()
            return {
                r["instance_id"]: (float(r.get("started_at") or now), self._ended_at(r, now)) for r in records
            }

        return start_readings.record(self.workdir, finished, spans=spans)

    def _finished_runner(self, rec: dict[str, Any]) -> dict[str, Any]:
        """What start_readings.record reads of a finished runner: its start's share of a core over its own
        seconds, from the runners that ran beside it and the other work at its launch (older records: the
        share at its launch)."""
        runner = {
            "id": rec["instance_id"],
            "log": rec.get("log") or str(self.log_path(rec["instance_id"])),
            "forked": bool(rec.get("forked")),
            "share": rec.get("host_share", 1.0),
        }
        if "other_work" in rec and "started_at" in rec:
            runner.update(started_at=rec["started_at"], cores=machine_cores(), other_work=rec["other_work"])
        return runner

    def _ended_at(self, rec: dict[str, Any], now: float) -> float:
        """When a runner's process ended (its exit file written, or its termination); ``now`` if it runs."""
        try:
            return self.exit_code_path(rec["instance_id"]).stat().st_mtime
        except OSError:
            return float(rec.get("terminated_at") or now) if rec.get("terminated") else now

    BUSY_READING_S = 300.0

    def _cores_busy(self, runs: float) -> float:
        """The cores' worth the machine is busy on, read once and kept BUSY_READING_S for every process on
        this workdir, one reading for each count of tunebot's own runs here (a run started or ended is a
        change the next quote prices; the reading from before it began holds again once it ends). Each door
        reading it for itself quoted one request differently a minute apart (the CLI $0.0003, the console
        $0.0002), a run's quote after its calibrating run differed from the one before it by the moment's
        load, and a launch could start with other threads than its quote priced."""
        path, key, now = self.workdir / "cores-busy.json", f"{runs:g}", time.time()
        try:
            saved = {
                k: v
                for k, v in json.loads(path.read_text()).items()
                if 0 <= now - float(v["at"]) <= self.BUSY_READING_S
            }
        except (OSError, ValueError, TypeError, KeyError, AttributeError):  # none yet, or unreadable
            saved = {}
        if key in saved:
            try:
                return max(0.0, min(float(saved[key]["cores"]), float(machine_cores())))
            except (ValueError, TypeError, KeyError):
                pass
        busy = round(self._busy.cores(), 2)
        saved[key] = {"at": now, "cores": busy}
        save_reading(path, saved)
        return busy

    def thread_share(self, busy: float | None = None) -> dict[str, str]:
        """The runner's threads (runner/train.py reads TUNEBOT_CPU_THREADS; nothing when OMP_NUM_THREADS is
        set: the runner's torch reads that itself). ``busy``: as ``threads`` takes it."""
        if "OMP_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in self.extra_env:
            return {}
        return {"TUNEBOT_CPU_THREADS": str(self.threads(busy))}

    def _warm_start(self) -> bool:
        """Whether a runner launched now forks from a prewarmed process (bot/providers/prewarm.py)."""
        if not self._prewarm_on() or list(self.runner_command) != list(DEFAULT_RUNNER_COMMAND):
            return False
        return prewarm.shared(sys.executable).ready({**inherited_env(os.environ), **self.extra_env})

    def _prewarm_after(self) -> int | None:
        """Launches from now until one starts the prewarmed process beside its runner (None: none will)."""
        if not self._prewarm_on() or list(self.runner_command) != list(DEFAULT_RUNNER_COMMAND):
            return None
        return prewarm.shared(sys.executable).launches_until_warming(
            {**inherited_env(os.environ), **self.extra_env}
        )

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        if query.gpu not in (None, "cpu"):
            return []
        return finish_search([self.offer()], query)

    def quote(self, offer: Offer) -> Offer:
        return self.offer()

    # -- process liveness --------------------------------------------------------------------------
    def _alive(self, rec: dict[str, Any]) -> bool:
        pid = int(rec["pid"])
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        state = _proc_state(pid)
        if state is None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return rec.get("start_ticks") is None  # no /proc: trust kill(0)
        if state in ("Z", "X"):
            return False
        return rec.get("start_ticks") in (None, _proc_start_ticks(pid))

    def _read_exit(self, instance_id: str) -> int | None:
        try:
            return int(self.exit_code_path(instance_id).read_text().strip())
        except (OSError, ValueError):
            return None

    def _instance(self, rec: dict[str, Any]) -> Instance:
        iid = rec["instance_id"]
        exit_code = rec.get("exit_code")
        if rec.get("terminated"):
            status, raw = InstanceStatus.terminated, "terminated"
        elif self._alive(rec):
            status, raw = InstanceStatus.running, "running"
        else:
            exit_code = self._read_exit(iid) if exit_code is None else exit_code
            status, raw = InstanceStatus.exited, f"exited({exit_code})"
        exited_at = None
        if status != InstanceStatus.running:
            try:  # the wrapper writes the exit code as the runner ends
                exited_at = datetime.fromtimestamp(self.exit_code_path(iid).stat().st_mtime, UTC)
            except OSError:
                exited_at = None
        return Instance(
            provider=self.name,
            instance_id=iid,
            label=rec.get("label"),
            status=status,
            raw_status=raw,
            price_per_hour=rec.get("price_per_hour"),
            gpu="cpu",
            gpu_count=1,
            ip="127.0.0.1",
            started_at=datetime.fromtimestamp(rec["started_at"], UTC),
            created_at=datetime.fromtimestamp(rec["started_at"], UTC),
            exit_code=exit_code,
            exited_at=exited_at,
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> Instance:
        runs = float(len(self.list_instances()))  # before the state's lock: it lists the live runners
        busy = max(runs, self._cores_busy(runs))
        share = self.thread_share(busy)
        # the share of a core this runner's start gets (as plan.cpu_share prices it): its start is read back
        # at a whole core (start_readings)
        host_share = min(1.0, machine_cores() / (busy + 1.0))
        other_work = max(0.0, busy - runs)  # the cores' worth busy on work that is not tunebot's runners
        with self._state(write=True) as state:
            for rec in state.values():
                if rec.get("label") == request.label and not rec.get("terminated"):
                    return self._instance(rec)
            cutoff = time.time() - FORGET_TERMINATED_AFTER_S
            for iid in [
                i for i, r in state.items() if r.get("terminated") and r.get("terminated_at", 0) < cutoff
            ]:
                del state[iid]  # long gone; their logs stay in instances/<id>/
            instance_id = f"local-{uuid.uuid4().hex[:10]}"
            folder = self.instance_dir(instance_id)
            folder.mkdir(parents=True, exist_ok=True)
            command = list(request.command or self.runner_command)
            env = {
                **inherited_env(os.environ),
                **self.extra_env,
                **request.env,
                "TUNEBOT_EXIT_FILE": str(self.exit_code_path(instance_id)),
                "TUNEBOT_PID_FILE": str(self.pid_path(instance_id)),
                "TUNEBOT_INSTANCE_ID": instance_id,
                "TUNEBOT_JOB_ID": request.job_id,
                **share,
            }
            pid, forked = self._start(instance_id, command, env, folder)
            self._hidden[instance_id] = [v for k, v in request.env.items() if k not in _PUBLIC_ENV and v]
            rec = {
                "instance_id": instance_id,
                "label": request.label,
                "job_id": request.job_id,
                "pid": pid,
                "start_ticks": _proc_start_ticks(pid),
                "started_at": time.time(),
                "price_per_hour": request.offer.price_per_hour
                if request.offer.provider == self.name
                else self.price_per_hour,
                "command": command[:1],
                "log": str(self.log_path(instance_id)),
                "exit_file": str(self.exit_code_path(instance_id)),
                "terminated": False,
                "exit_code": None,
                "forked": forked,
                "host_share": round(host_share, 3),
                "other_work": round(other_work, 3),
            }
            state[instance_id] = rec
            return self._instance(rec)

    def _start(
        self, instance_id: str, command: list[str], env: dict[str, str], folder: Path
    ) -> tuple[int, bool]:
        """The pid of the session leader that waits for the runner and records its exit code, and whether it
        was forked from a prewarmed process (when the command is the runner's own: bot/providers/prewarm.py),
        else started by the shell wrapper."""
        default = list(DEFAULT_RUNNER_COMMAND)
        if self._prewarm_on() and command[: len(default)] == default:
            self.log_path(instance_id).touch()
            pid = prewarm.shared(sys.executable).start(
                args=command[len(default) :],
                env=env,
                cwd=folder,
                log_file=self.log_path(instance_id),
                pid_file=self.pid_path(instance_id),
                exit_file=self.exit_code_path(instance_id),
            )
            if pid is not None:
                return pid, True
        with open(self.log_path(instance_id), "ab") as log:
            try:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, "tunebot-local", *command],
                    cwd=folder,  # not the bot's working directory (see DEFAULT_RUNNER_COMMAND)
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise InvalidRequestError(
                    f"local: cannot start the runner: {exc.strerror}", provider=self.name
                ) from exc
        self._children[proc.pid] = proc
        return proc.pid, False

    def warm(self) -> None:
        """Start the prewarmed process for this provider's runners now (a process that will launch several:
        the demo); launches fork from it once it has imported the libraries. Nothing when prewarm is off."""
        if self._prewarm_on() and list(self.runner_command) == list(DEFAULT_RUNNER_COMMAND):
            prewarm.shared(sys.executable).warm({**inherited_env(os.environ), **self.extra_env})

    def _prewarm_on(self) -> bool:
        if self.prewarm is None:
            from bot.settings import get_settings

            self.prewarm = get_settings().local_prewarm
        return self.prewarm

    def _record(self, instance_id: str) -> dict[str, Any]:
        with self._state() as state:
            rec = state.get(instance_id)
        if rec is None:
            raise NotFoundError(f"local: instance {instance_id} not found", provider=self.name)
        return rec

    def status(self, instance_id: str) -> Instance:
        return self._instance(self._record(instance_id))

    def list_instances(self) -> list[Instance]:
        with self._state() as state:
            records = [r for r in state.values() if not r.get("terminated")]
        return [self._instance(r) for r in records]

    def _runner_pid(self, rec: dict[str, Any], wait_s: float = 1.0) -> int | None:
        """The runner's pid (the wrapper's child), if it is still in the wrapper's session."""
        path = self.pid_path(rec["instance_id"])
        deadline = time.monotonic() + wait_s
        while True:
            try:
                pid = int(path.read_text().strip())
            except (OSError, ValueError):
                pid = None
            if pid is not None:
                try:
                    return pid if os.getpgid(pid) == int(rec["pid"]) else None
                except ProcessLookupError:
                    return None
            if time.monotonic() >= deadline or not self._alive(rec):
                return None
            time.sleep(0.002)

    def _signal(self, rec: dict[str, Any], sig: int) -> None:
        """SIGTERM goes to the runner itself; anything else to the whole session (pgid == wrapper pid)."""
        if not self._alive(rec):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            runner = self._runner_pid(rec) if sig == signal.SIGTERM else None
            if runner is not None:
                os.kill(runner, sig)
            else:
                os.killpg(int(rec["pid"]), sig)

    def _wait_dead(self, rec: dict[str, Any], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._alive(rec):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def _stop(self, rec: dict[str, Any], grace_s: float) -> int | None:
        """SIGTERM to the runner, SIGKILL to its session after grace; the exit code, 137 if killed."""
        self._signal(rec, signal.SIGTERM)
        if not self._wait_dead(rec, grace_s):
            self._signal(rec, signal.SIGKILL)
            self._wait_dead(rec, 5.0)
            if self._read_exit(rec["instance_id"]) is None:
                path = self.exit_code_path(rec["instance_id"])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"{KILLED_EXIT_CODE}\n")
        # The runner may leave children behind in its session; nothing of ours keeps billing.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(rec["pid"]), signal.SIGKILL)
        self._reap(int(rec["pid"]))
        return self._read_exit(rec["instance_id"])

    def _reap(self, pid: int) -> None:
        child = self._children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1.0)

    def preempt(self, instance_id: str, grace_s: float = 5.0) -> Instance:
        """Like a spot reclaim: SIGTERM, SIGKILL after ``grace_s``. The instance stays (``exited``)."""
        rec = self._record(instance_id)
        if rec.get("terminated"):
            raise NotFoundError(f"local: instance {instance_id} is terminated", provider=self.name)
        self._stop(rec, grace_s)
        return self.status(instance_id)

    def terminate(self, instance_id: str, grace_s: float = 2.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and mark it terminated; missing is done."""
        with self._state() as state:
            rec = state.get(instance_id)
        if rec is None or rec.get("terminated"):
            return
        exit_code = self._stop(rec, grace_s)
        with self._state(write=True) as state:
            if instance_id in state:
                state[instance_id]["terminated"] = True
                state[instance_id]["exit_code"] = exit_code
                state[instance_id]["terminated_at"] = time.time()

    def exit_message(self, instance_id: str) -> str | None:
        """Why the runner ended, in its own words (with none of the values it was given)."""
        said = self._last_words(instance_id)
        return redact(said, self._hidden.get(instance_id, [])) if said else said

    def _last_words(self, instance_id: str) -> str | None:
        """The summary line's message, else the runner's last error line."""
        try:
            lines = [ln.strip() for ln in self.log_path(instance_id).read_text(errors="replace").splitlines()]
        except OSError:
            return None
        lines = [ln for ln in lines if ln]
        if lines and lines[-1].startswith("{"):
            try:
                message = json.loads(lines[-1]).get("message")
            except ValueError:
                message = None
            if message:
                return str(message)[:1000]
        errors = [ln for ln in lines if ln.startswith("error:") or "Error:" in ln]
        return errors[-1][:1000] if errors else None

    def find_by_label(self, label: str) -> list[Instance]:
        return [i for i in self.list_instances() if i.label == label]

    def list_volumes(self) -> list[Volume]:
        return []

    def delete_volume(self, volume_id: str) -> None:
        return None

    def burn_rate(self) -> float | None:
        return round(
            sum(i.price_per_hour or 0.0 for i in self.list_instances() if i.status == InstanceStatus.running),
            6,
        )
