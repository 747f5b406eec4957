"""The step loop at the speed of the device (issue 37): no host sync per step beyond what reporting needs,
timed checkpoint saves written and uploaded off the loop, evals only where something needs them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from runner import checkpoint as ckpt
from runner.contract.spec import EventKind, parse_progress
from runner.train import Preemption, Trainer


def _events(spec: Any) -> list[Any]:
    return parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())


def _trainer(spec: Any) -> Trainer:
    trainer = Trainer(spec, Preemption())
    trainer.setup()
    return trainer


def _held_upload(trainer: Trainer, release: threading.Event, released: list[bool] | None = None) -> list[int]:
    """The store's first upload made to wait for ``release`` (a slow upload; ``released``: whether it came
    while the upload waited); the steps it was asked for."""
    assert trainer.store is not None
    real = trainer.store.upload
    asked: list[int] = []

    def upload(local: Path, step: int, **kwargs: Any) -> str:
        asked.append(step)
        if len(asked) == 1:
            came = release.wait(timeout=30)
            if released is not None:
                released.append(came)
        return real(local, step, **kwargs)

    trainer.store.upload = upload  # type: ignore[method-assign]
    return asked


def test_a_save_blocked_on_a_slow_upload_does_not_block_the_step_loop(
    runner_job: Callable[..., Any],
) -> None:
    """The first timed save's upload waits until the loop has trained two more steps: on 9a0c9c1 the save
    wrote, hashed and uploaded inside the loop, so the loop never got there (the upload waited its 30 s
    out and the test fails). The checkpoint is announced once complete, with its own step and digest."""
    spec = runner_job(
        max_steps=6,
        seq_len=128,
        plateau={"enabled": False},
        checkpoint={"every_minutes": 1e-9, "keep": 10},  # due at every step
        samples={"count": 0},
    )
    trainer = _trainer(spec)
    trained_on = threading.Event()
    real_step = trainer._step

    def step(micro: list[Any]) -> Any:
        out = real_step(micro)
        if trainer.state.step + 1 >= 3:  # the third step is done
            trained_on.set()
        return out

    trainer._step = step  # type: ignore[method-assign]
    released: list[bool] = []
    asked = _held_upload(trainer, trained_on, released)
    try:
        status = trainer.train()
    finally:
        trainer.close()
    assert status == "finished"
    assert released == [True] and asked[0] == 1  # the loop trained on while step 1's save uploaded
    # while it uploaded, the saves due were not queued behind it; the next came once it was done
    assert asked[1] >= 3 and asked == sorted(set(asked))
    announced = [e for e in _events(spec) if e.kind is EventKind.checkpoint]
    assert [e.step for e in announced] == asked
    assert all(e.manifest_sha256 and e.checkpoint_uri.endswith(f"checkpoint-{e.step}") for e in announced)
    assert ckpt.CheckpointStore(spec.checkpoint.uri).complete_steps() == asked


def test_a_preemption_during_a_background_save_completes_both_before_exit(
    runner_job: Callable[..., Any],
) -> None:
    """SIGTERM while a timed save uploads: the preemption's own save waits for it, then writes its own; both
    are complete (COMPLETE marker) when train() returns, and the preempted event names the newest."""
    spec = runner_job(
        max_steps=50,
        seq_len=128,
        plateau={"enabled": False},
        checkpoint={"every_minutes": 1e-9, "keep": 10},
        samples={"count": 0},
    )
    trainer = _trainer(spec)
    release = threading.Event()
    asked = _held_upload(trainer, release)
    real_step = trainer._step

    def step(micro: list[Any]) -> Any:
        out = real_step(micro)
        if trainer.state.step + 1 == 2:  # step 1's save is uploading: the host is told to stop
            trainer.preemption.requested = True
            release.set()
        return out

    trainer._step = step  # type: ignore[method-assign]
    try:
        status = trainer.train()
    finally:
        trainer.close()
    assert status == "preempted" and asked == [1, 2]
    assert ckpt.CheckpointStore(spec.checkpoint.uri).complete_steps() == [1, 2]
    (preempted,) = [e for e in _events(spec) if e.kind is EventKind.preempted]
    assert preempted.checkpoint_uri.endswith("checkpoint-2") and preempted.manifest_sha256


# Ops that make the host wait for a GPU: a read of a value (.item(), float(), int(): _local_scalar_dense) or
# an output whose size depends on the data (nonzero; a boolean mask as an index).
def _counting_syncs() -> tuple[Any, list[str]]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            name = func.overloadpacket.__name__
            boolean = name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for i in (args[1] if len(args) > 1 else ())
            )
            if name in ("_local_scalar_dense", "nonzero", "masked_select") or boolean:
                seen.append(name)
            return func(*args, **(kwargs or {}))

    return Mode(), seen


def test_an_optimizer_step_reads_nothing_back(runner_job: Callable[..., Any], monkeypatch: Any) -> None:
    """Issue 37: 9a0c9c1 read every micro-step's loss back (``.cpu()`` after each backward: the GPU's queue
    drained every step) and the loss's boolean mask synced inside the forward. Now a step's loss stays on the
    device (runner/readback.py) and is read with the others at the next report. The batches' host-side
    preparation (runner/data/batching.model_inputs: host tensors, no device) is not counted."""
    from torch.utils._python_dispatch import _disable_current_modes

    from runner import attention
    from runner.data import batching

    spec = runner_job(max_steps=4, seq_len=128, micro_batch_size=2, grad_accum=2, plateau={"enabled": False})
    trainer = _trainer(spec)
    # As the runner runs on CUDA: attention without a mask to build (runner/attention.py), and fused AdamW
    # (torch's for-loop AdamW, the CPU's default, reads its step count back in every update).
    trainer.model.config._attn_implementation = attention.register()
    trainer.optimizer = torch.optim.AdamW(trainer.params, lr=1e-3, fused=True)
    trainer.scheduler = trainer._scheduler()
    real_inputs = batching.model_inputs

    def host_side(*args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return real_inputs(*args, **kwargs)

    monkeypatch.setattr(batching, "model_inputs", host_side)
    mode, syncs = _counting_syncs()
    batches = trainer.batches_for(trainer.data.train, 0)
    losses = []
    try:
        for i in range(3):
            micro = [batches[2 * i], batches[2 * i + 1]]  # built before the count: host work
            with mode:
                loss, _ = trainer._step(micro)
            losses.append(loss)
    finally:
        trainer.close()
    assert syncs == []
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in losses)  # still on the device
    assert all(0 < float(v) < 20 for v in losses)


def test_losses_are_read_back_at_reports_not_at_every_step(
    runner_job: Callable[..., Any], monkeypatch: Any
) -> None:
    """A run of 8 steps reporting once (its end) reads its losses back once or twice (the end's report and
    the output), not 8 times; every step still reaches the chart with its own loss."""
    from runner import readback

    reads: list[int] = []
    real = readback.PendingLosses.read

    def read(self: Any) -> Any:
        rows = real(self)
        if rows:
            reads.append(len(rows))
        return rows

    monkeypatch.setattr(readback.PendingLosses, "read", read)
    spec = runner_job(
        max_steps=8,
        seq_len=128,
        plateau={"enabled": False},
        report={"every_seconds": 1e9},
        checkpoint={"every_minutes": 600},
        samples={"count": 0},
    )
    trainer = _trainer(spec)
    try:
        assert trainer.train() == "finished"
    finally:
        trainer.close()
    assert sum(reads) == 8 and len(reads) <= 2
    points = [p for e in _events(spec) for p in (e.points or [])]
    assert [p[0] for p in points] == list(range(1, 9)) and all(p[1] > 0 for p in points)


def test_without_the_plateau_stop_or_keep_best_evals_run_only_before_and_at_the_end(
    runner_job: Callable[..., Any], tmp_path: Path, capsys: Any
) -> None:
    """Issue 37: 9a0c9c1 evaluated every max(10, steps/50) steps whatever needed it. With the plateau stop
    off and keep=last nothing needs the curve: the base model's pass and the final one, as the planner prices
    it (runner/contract/steps.eval_every; the length says so)."""
    from runner.train import run

    spec = runner_job(
        max_steps=25,
        seq_len=128,
        keep="last",
        plateau={"enabled": False},
        dataset={"eval_fraction": 0.2},
        checkpoint={"every_minutes": 600},
        samples={"count": 0},
    )
    summary, code = run(spec)
    out = capsys.readouterr().out
    assert code == 0, summary
    evals = [line for line in out.splitlines() if line.startswith("eval loss")]
    assert [line.split(" at step ")[1].split()[0] for line in evals] == ["0", "25"]
    assert "eval before training and at the end: 2 passes" in out


@pytest.mark.parametrize(
    ("keep", "plateau", "passes"), [("best", False, 4), ("last", True, 4), ("last", False, 2)]
)
def test_the_eval_schedule_is_one_rule_for_the_planner_and_the_runner(
    keep: str, plateau: bool, passes: int
) -> None:
    from runner.contract.spec import PlateauSpec
    from runner.contract.steps import eval_every, run_length

    length = run_length(
        [100] * 200,
        [100] * 20,
        seq_len=256,
        micro_batch_size=1,
        grad_accum=1,
        processes=1,
        packing=True,
        seed=0,
        epochs=1.0,
        max_steps=30,
        plateau=PlateauSpec(enabled=plateau),
        keep=keep,
    )
    assert length.evaluations == passes  # 1 + ceil(30 / 10) with a cadence, else before and at the end
    every = eval_every(PlateauSpec(enabled=plateau), 30, keep=keep, processes=1)
    assert every == (10 if passes == 4 else None)
