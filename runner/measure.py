"""What a run measures for the planner's calibration: peak memory, device memory in use, steady speed.

- max_memory_reserved_gb: torch.cuda.max_memory_reserved() of this process (GB = 1e9 bytes), what the caching
  allocator held at its peak: the planner's estimate without the CUDA context;
- device_memory_used_gb: the most the whole device had in use at any step end (NVML's used memory when pynvml
  is installed, else total - free from cudaMemGetInfo): CUDA context, NCCL buffers and other processes
  included;
- tokens_per_second: tokens over the time spent in optimizer steps (forward, backward, update; checkpoint
  saves, evaluation and reporting excluded) after the first WARMUP_STEPS steps (compilation, allocator warm-up
  and the first data reads are not what a long run sees), all processes together. On a CPU the memory figures
  are None: there is no device to read.
"""

from __future__ import annotations

from typing import Any

WARMUP_STEPS = 3


class RunMeter:
    def __init__(self, device: Any, warmup: int = WARMUP_STEPS) -> None:
        self.warmup = warmup
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
        if self.tokens and self.seconds > 0:
            out["tokens_per_second"] = round(self.tokens / self.seconds, 3)
        if self.cuda:
            import torch

            out["max_memory_reserved_gb"] = round(torch.cuda.max_memory_reserved(self.device) / 1e9, 4)
            out["device_memory_used_gb"] = round(self.device_used / 1e9, 4) if self.device_used else None
        return out
