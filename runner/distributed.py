"""More than one process: the launcher (spawn N workers, forward SIGTERM) and each worker's view of the group.

`tunebot-runner` with `gpus > 1` starts one worker per GPU with the torch.distributed environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), the same contract as `torchrun` and
`accelerate launch`, but from our own small launcher so that SIGTERM reaches every worker (launchers do
not all forward it) and the exit code of the run is the one of rank 0. Workers use NCCL on CUDA and gloo
on CPU. Every method trains with FSDP by default (FULL_SHARD, transformer-block wrap,
use_orig_params=False; peft's wrap policy for adapters; QLoRA's 4-bit storage dtype equals the compute
dtype, see runner/model.py), which is what the planner prices; a spec may ask for DDP (a full copy per
process) with ``sharding: ddp``.

Tests (and a CPU-only demo) ask for N CPU processes with `gpus: 0` plus the environment variable
TUNEBOT_CPU_PROCESSES=N: the launcher then starts N gloo workers on the CPU.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from runner.contract.spec import EXIT_BUDGET, EXIT_FAILED, EXIT_OUT_OF_MEMORY, EXIT_PREEMPTED

CPU_PROCESSES_ENV = "TUNEBOT_CPU_PROCESSES"
FAILURE_GRACE_SECONDS = 30.0  # after one worker fails, how long the others get to end by themselves
WORKER_ENV = "TUNEBOT_WORKER"


def processes_for(gpus: int) -> int:
    """How many worker processes a spec asks for (1 means: train in this process)."""
    if gpus > 1:
        return gpus
    if gpus == 0 and os.environ.get(CPU_PROCESSES_ENV):
        return max(1, int(os.environ[CPU_PROCESSES_ENV]))
    return 1


def is_worker() -> bool:
    return os.environ.get(WORKER_ENV) == "1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(spec_json: str, processes: int, *, sigterm_seen: bool = False) -> int:
    """Run `processes` workers of this runner on this machine; return rank 0's exit code.

    A rank out of GPU memory stops the run at once (the others wait in a collective) and the workers start
    again one back-off level further (runner/oom.py: smaller micro-batches, then checkpointing), from the
    newest checkpoint; past the last level the run exits EXIT_OUT_OF_MEMORY.
    """
    from runner import oom

    level = int(os.environ.get(oom.LEVEL_ENV, "0") or 0)
    while True:
        code = _launch_once(spec_json, processes, sigterm_seen=sigterm_seen, level=level)
        if code != EXIT_OUT_OF_MEMORY:
            return code
        following, where, now = oom.next_level(spec_json, level)
        if following is None:
            from runner.contract.spec import RunSummary

            message = f"out of GPU memory at {where} on every rank's share; needs a GPU with more memory"
            oom.report(spec_json, "out_of_memory", message)
            print(RunSummary(status="out_of_memory", message=message).model_dump_json(), flush=True)
            return EXIT_OUT_OF_MEMORY
        message = f"out of GPU memory at {where}; restarting the {processes} processes at {now}"
        print(f"note: {message}", flush=True)
        oom.report(spec_json, "progress", message)
        level = following


def _launch_once(spec_json: str, processes: int, *, sigterm_seen: bool, level: int) -> int:
    """One start of the workers. Only rank 0 writes to stdout (the summary line stays the last line); other
    ranks' stdout is dropped and their stderr kept. SIGTERM and SIGINT are forwarded to every worker."""
    from runner import oom

    port = _free_port()
    workers: list[subprocess.Popen[bytes]] = []
    for rank in range(processes):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(processes),
            LOCAL_WORLD_SIZE=str(processes),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TUNEBOT_JOB_SPEC=spec_json,
            **{WORKER_ENV: "1", oom.LEVEL_ENV: str(level)},
        )
        stdout = None if rank == 0 else subprocess.DEVNULL
        workers.append(subprocess.Popen([sys.executable, "-m", "runner.cli"], env=env, stdout=stdout))

    def forward(signum: int, _frame: Any) -> None:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    if sigterm_seen:  # arrived while this process was still starting
        forward(signal.SIGTERM, None)
    stopped_by_launcher = False
    try:
        first_failure: float | None = None
        while any(worker.poll() is None for worker in workers):
            failed = [w for w in workers if w.poll() not in (None, 0, EXIT_PREEMPTED, EXIT_BUDGET)]
            if any(w.poll() == EXIT_OUT_OF_MEMORY for w in failed):  # the others wait in a collective
                for worker in workers:
                    if worker.poll() is None:
                        worker.kill()
                for worker in workers:
                    worker.wait()
                return EXIT_OUT_OF_MEMORY
            if failed and first_failure is None:
                first_failure = time.monotonic()
            if first_failure is not None and time.monotonic() - first_failure > FAILURE_GRACE_SECONDS:
                # A crashed rank leaves the others blocked in a collective: stop them.
                for worker in workers:
                    if worker.poll() is None:
                        worker.kill()
                        stopped_by_launcher = stopped_by_launcher or worker is workers[0]
            time.sleep(0.1)
        codes = [worker.wait() for worker in workers]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopped_by_launcher:  # rank 0 could not print its summary: the launcher does
        from runner.contract.spec import RunSummary

        failures = [(r, c) for r, c in enumerate(codes) if c not in (0, EXIT_PREEMPTED, EXIT_BUDGET)]
        rank, code = next(((r, c) for r, c in failures if c != -9), failures[0])
        message = f"worker rank {rank} exited with code {code}; the other workers were stopped"
        print(RunSummary(status="failed", message=message).model_dump_json(), flush=True)
        return EXIT_FAILED
    if codes[0] != 0:
        return codes[0]
    return next((code for code in codes if code != 0), 0)


@dataclass
class Group:
    """This process's place in the run: rank, world size and device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: Any = None  # torch.device; torch is imported lazily so that the launcher stays light

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def all_max(self, values: list[float]) -> list[float]:
        """Element-wise max over ranks (flags such as 'SIGTERM seen' or 'checkpoint due')."""
        if not self.distributed:
            return values
        import torch

        tensor = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor.tolist()

    def all_sum(self, values: list[float]) -> list[float]:
        if not self.distributed:
            return values
        import torch

        tensor = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor.tolist()

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's object on rank 0 (others get an empty list)."""
        if not self.distributed:
            return [obj]
        import torch

        out: list[Any] = [None] * self.world if self.main else []
        torch.distributed.gather_object(obj, out if self.main else None, dst=0)
        return out

    def barrier(self) -> None:
        if self.distributed:
            import torch

            torch.distributed.barrier()

    @property
    def _comm_device(self) -> Any:
        return self.device if self.device.type == "cuda" else "cpu"

    def close(self) -> None:
        import torch

        if self.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def setup(gpus: int) -> Group:
    """Join the process group when launched as a worker; pick the device (CUDA only when gpus >= 1)."""
    import torch

    use_cuda = gpus >= 1 and torch.cuda.is_available()
    if gpus >= 1 and not use_cuda:
        print("note: no CUDA device found; training on the CPU", flush=True)
    world = int(os.environ.get("WORLD_SIZE", "1")) if is_worker() else 1
    rank = int(os.environ.get("RANK", "0")) if is_worker() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if is_worker() else 0
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        torch.distributed.init_process_group(
            backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world
        )
    return Group(rank=rank, world=world, local_rank=local_rank, device=device)


def wrap(model: Any, group: Group, strategy: str, *, mixed: bool = False) -> Any:
    """The model wrapped for ``strategy`` (JobSpec.strategy: "none", "ddp" or "fsdp").

    FSDP: FULL_SHARD, transformer-block auto-wrap, use_orig_params=False. For LoRA/QLoRA peft's own
    policy (``peft.utils.other.fsdp_auto_wrap_policy``, what ``accelerate launch`` with FSDP uses for peft
    models) also gives every trainable Linear its own FSDP unit, so no flat parameter mixes trainable and
    frozen tensors and the adapters keep their dtype; weights, gradients and optimizer states are sharded,
    as the planner prices every method on more than one GPU. ``mixed`` (a full fine-tune with fp32 master
    weights): FSDP's MixedPrecision gathers the units in bf16 and reduces gradients in fp32, so the traffic
    and the unsharded units are 16-bit, as priced (bot/planner/speed.py, memory.py).
    """
    if not group.distributed or strategy == "none":
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [group.device.index] if group.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    import functools

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if hasattr(model, "peft_config"):
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
    else:
        layer_classes = {type(m) for m in model.modules() if type(m).__name__.endswith("DecoderLayer")}
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes)
    precision = None
    if mixed:
        import torch
        from torch.distributed.fsdp import MixedPrecision

        precision = MixedPrecision(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16
        )
    return FSDP(
        model,
        auto_wrap_policy=policy,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        use_orig_params=False,
        device_id=group.device,
        limit_all_gathers=True,
        mixed_precision=precision,
    )
