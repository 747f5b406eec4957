"""What a run measures: where its time went, by phase; peak memory, device memory in use; steady speed.

- phases (``PhaseClock``): every second from the instance's start to the run's last report in exactly one
  phase of runner/contract/phases.py, so they add up to the billed wall clock: the host's start before this
  process (from CostSpec.billed_from, bounded as the cap's own count is), this process's start and imports
  (on a stock image the install runs in it before the runner is exec'd), then whatever phase the run is in;
- max_memory_reserved_gb: torch.cuda.max_memory_reserved() of this process (GB = 1e9 bytes), what the caching
  allocator held at its peak: the planner's estimate without the CUDA context;
- device_memory_used_gb: the most the whole device had in use at any step end (NVML's used memory when pynvml
  is installed, else total - free from cudaMemGetInfo): CUDA context, NCCL buffers and other processes
  included;
- tokens_per_second: with a clock (the runner), the tokens of the steps after the first over the wall time
  of the steady phases (steps, optimizer, logging: each batch built and moved, the step, the reports between
  steps; evals and checkpoint saves are phases of their own): the speed that is billed, which calibration
  learns. Without one (bench/gpu_check), the seconds each ``step`` is given after the first WARMUP_STEPS.
  All processes together. On a CPU the memory figures are None: there is no device to read.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from runner.contract.phases import PHASES, STEADY

WARMUP_STEPS = 3  # bench/gpu_check's meter without a clock; the runner's warm-up is its first step


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc; exec keeps the start, so a stock image's install
    before the runner was exec'd counts), None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class PhaseClock:
    """Every second of a run in exactly one phase (runner/contract/phases.py): a run is always in one phase
    (``start`` first), ``phase(name)`` moves it there for a while, and ``seconds()`` is what each took,
    earlier runs of the job included (``carry``). Main thread only."""

    def __init__(self, *, before: float = 0.0, now: float | None = None) -> None:
        """``before``: seconds of the start that passed before this clock was made (the host's boot and
        this process's start), counted in ``start``."""
        self._at = time.monotonic() if now is None else now
        self.current = "start"
        self._mine: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._mine["start"] = max(0.0, before)
        self._earlier: dict[str, float] = {}
        self._held = 0

    @classmethod
    def for_run(cls, billed_from: float | None, max_start_s: float) -> PhaseClock:
        """A clock started at this process's start, with the host's start before it counted from
        ``billed_from`` (the bot's clock: bounded by ``max_start_s`` as runner.contract.spec.CostSpec.paid
        bounds it, so a host clock far off neither inflates nor hides it)."""
        age = process_age() or 0.0
        boot = 0.0
        if billed_from is not None:
            boot = min(max(0.0, time.time() - age - billed_from), max_start_s)
        return cls(before=age + boot)

    def switch(self, name: str, now: float | None = None) -> str:
        """Move to phase ``name`` (the time so far goes to the current one); returns the phase left."""
        now = time.monotonic() if now is None else now
        left = self.current
        if self._held:
            return left
        self._mine[left] += max(0.0, now - self._at)
        self._at, self.current = now, name
        return left

    @contextlib.contextmanager
    def phase(self, name: str, *, hold: bool = False) -> Iterator[None]:
        """In phase ``name`` for the block, then back; ``hold``: phases asked for inside stay in this one
        (the first step's optimizer is part of the warm-up)."""
        left = self.switch(name)
        self._held += hold
        try:
            yield
        finally:
            self._held -= hold
            self.switch(left)

    def carry(self, earlier: dict[str, float] | None) -> None:
        """The job's earlier runs' phases (from the checkpoint this run resumed), added to this run's."""
        self._earlier = {k: float(v) for k, v in (earlier or {}).items() if k in self._mine}

    def run_seconds(self, now: float | None = None) -> dict[str, float]:
        """This run's phases so far (the current one up to now)."""
        now = time.monotonic() if now is None else now
        out = dict(self._mine)
        out[self.current] += max(0.0, now - self._at)
        return out

    def seconds(self, now: float | None = None) -> dict[str, float]:
        """The job's phases so far: earlier runs' and this one's, rounded to the millisecond."""
        mine = self.run_seconds(now)
        return {k: round(mine[k] + self._earlier.get(k, 0.0), 3) for k in PHASES}

    def steady_seconds(self, now: float | None = None) -> float:
        """This run's wall time in the steady phases (what its steady tokens/s is measured over)."""
        mine = self.run_seconds(now)
        return sum(mine[k] for k in STEADY)


class RunMeter:
    def __init__(self, device: Any, warmup: int = WARMUP_STEPS, clock: PhaseClock | None = None) -> None:
        self.clock = clock
        self.warmup = 1 if clock is not None else warmup  # with a clock: the warmup phase is the first step
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.device = device
        self.steps = 0
        self.tokens = 0
        self.seconds = 0.0
        self.device_used = 0.0
        self._nvml: Any = None
        if self.cuda:
            try:  # NVML when present: the driver's own view of the device
                import pynvml  # type: ignore[import-not-found]

                pynvml.nvmlInit()
                index = getattr(device, "index", None) or 0
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
            except Exception:  # noqa: BLE001 - optional: fall back to cudaMemGetInfo
                self._nvml = None

    def step(self, tokens: int, seconds: float) -> None:
        """After each optimizer step (its loss was read back, so the device is done with it)."""
        self.steps += 1
        if self.steps > self.warmup:
            self.tokens += tokens
            self.seconds += seconds
        if self.cuda:
            self.device_used = max(self.device_used, self._used_bytes())

    def _used_bytes(self) -> float:
        try:
            if self._nvml is not None:
                pynvml, handle = self._nvml
                return float(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            import torch

            free, total = torch.cuda.mem_get_info(self.device)
            return float(total - free)
        except Exception:  # noqa: BLE001 - a measurement must never stop training
            return 0.0

    def result(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {
            "max_memory_reserved_gb": None,
            "device_memory_used_gb": None,
            "tokens_per_second": None,
            "steady_steps": float(max(0, self.steps - self.warmup)),
        }
        seconds = self.clock.steady_seconds() if self.clock is not None else self.seconds
        if self.tokens and seconds > 0:
            out["tokens_per_second"] = round(self.tokens / seconds, 3)
        if self.cuda:
            import torch

            out["max_memory_reserved_gb"] = round(torch.cuda.max_memory_reserved(self.device) / 1e9, 4)
            out["device_memory_used_gb"] = round(self.device_used / 1e9, 4) if self.device_used else None
        return out
