"""A runner waiting on a checkpoint save or an upload is alive while bytes move, and idle when they stop.

The bot stops a runner whose heartbeats say it made no progress for TUNEBOT_IDLE_STOP_MINUTES
(bot/engine/watching/supervise.py). An eval batch touched the reporter (c45ebf9); the waits on a save did not:
the background save the loop waits for, the save on the way out (SIGTERM, the bot's stop request), the
output's upload. Issue 38 names "a long checkpoint upload" among what must not make a live runner look dead.
Now a wait counts as progress each round in which the save's thread is alive and moved bytes
(runner/checkpoint.py ``Moved``, ``BackgroundSave.wait``); a save whose thread hangs, or is gone, moves none
and the beats' ``stalled_s`` grows as before, so a hung runner is still stopped as idle.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

import runner.checkpoint as ckpt
import runner.report as report
from runner.contract import heartbeat
from runner.contract.integrity import KEY_ENV
from runner.contract.stop import request, request_uri

KEY = secrets.token_bytes(32)


class SlowMemory(MemoryFileSystem):
    """An object store whose writes are slow: each block waits ``pause`` seconds (the generic fsspec
    ``put_file`` writes ``blocksize`` at a time and reports each block, as s3fs reports each part); with
    ``hang`` set, the first write of an upload waits that long and moves nothing (a dead connection)."""

    protocol = "slowmem"
    blocksize = 1024
    pause = 0.02
    hang = 0.0  # the next write waits this long first (once)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return super()._strip_protocol(str(path).removeprefix("slowmem://"))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = super()._open(path, mode, **kwargs)
        if "w" in mode:
            real = handle.write

            def write(data: bytes) -> int:
                hang, SlowMemory.hang = SlowMemory.hang, 0.0
                time.sleep(hang or self.pause)
                return real(data)

            handle.write = write
        return handle


@pytest.fixture
def slow_store() -> Iterator[type[SlowMemory]]:
    fsspec.register_implementation("slowmem", SlowMemory, clobber=True)
    yield SlowMemory
    SlowMemory.hang, SlowMemory.pause = 0.0, 0.02
    for path in [p for p in MemoryFileSystem.store if p.startswith("/slow-")]:
        del MemoryFileSystem.store[path]


class Beats:
    """Every heartbeat the reporter writes, with when it was written."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, job_id: str) -> None:
        monkeypatch.setenv(KEY_ENV, KEY.hex())
        self.seen: list[tuple[float, heartbeat.Beat]] = []
        real = report.write_atomically

        def write(uri: str, data: bytes) -> None:
            real(uri, data)
            beat = heartbeat.parse(heartbeat.head(data), KEY, job_id)
            if beat is not None:
                self.seen.append((time.monotonic(), beat))

        monkeypatch.setattr(report, "write_atomically", write)

    def stalled_between(self, start: float, end: float) -> float:
        """The longest ``stalled_s`` of the beats written from ``start`` to ``end``."""
        during = [b.stalled_s for at, b in self.seen if start <= at <= end]
        assert len(during) >= 5, f"too few beats to tell: {len(during)}"
        return max(during)


def _staged(tmp_path: Path, size: int) -> Path:
    folder = tmp_path / "staged" / "checkpoint-5"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(secrets.token_bytes(size))
    (folder / "trainer_state.json").write_text("{}", encoding="utf-8")
    return folder


def _reporter(tmp_path: Path, job_id: str) -> report.Reporter:
    """A reporter beating every 50 ms, its step fixed at 5 (no step is progress here)."""
    from runner.contract.spec import CheckpointSpec, DatasetSpec, JobSpec, ReportSpec

    spec = JobSpec(
        job_id=job_id,
        base_model="tiny",
        dataset=DatasetSpec(uri="/tmp/d.jsonl"),
        checkpoint=CheckpointSpec(uri=str(tmp_path / "progress")),
        output_uri="/tmp/out",
        report=ReportSpec(callback_url=None, heartbeat_seconds=0.05),
    )
    return report.Reporter(spec, activity=lambda: 5)


def test_a_slow_checkpoint_upload_keeps_the_beat_fresh_and_a_hung_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_store: type[SlowMemory]
) -> None:
    """An upload of ~3 s (150 blocks, 20 ms each) waited for: every beat during it says the runner made
    progress within a fraction of a second. The same wait on an upload hung for 3 s (its thread alive,
    nothing moving), and the time after a save's thread is gone, are idleness: ``stalled_s`` grows."""
    beats = Beats(monkeypatch, "job-7")
    staged = _staged(tmp_path, 150 * SlowMemory.blocksize)
    store = ckpt.CheckpointStore(f"slowmem://slow-{secrets.token_hex(4)}/ckpt")
    reporter = _reporter(tmp_path, "job-7")
    try:
        # a slow upload that moves bytes
        moved = ckpt.Moved()
        saving = ckpt.BackgroundSave()
        start = time.monotonic()
        saving.start(lambda: store.upload(staged, 5, moved=moved), moved=moved)
        assert saving.wait(reporter.touch, every=0.05) == store.uri_of(5)
        end = time.monotonic()
        assert end - start > 2.0  # it was slow
        assert store.complete_steps() == [5]
        assert beats.stalled_between(start + 0.5, end) < 1.0

        # after it: the save's thread is gone, nothing touches; idle again
        time.sleep(1.5)
        assert beats.seen[-1][1].stalled_s > 1.0

        # a hung upload: its thread alive for 3 s, no byte moving (then the rest at once)
        SlowMemory.hang, SlowMemory.pause = 3.0, 0.0
        moved = ckpt.Moved()
        reporter.touch()
        start = time.monotonic()
        saving.start(lambda: store.upload(staged, 6, moved=moved), moved=moved)
        saving.wait(reporter.touch, every=0.05)
        end = time.monotonic()
        assert beats.stalled_between(start, end) > 2.0
    finally:
        reporter.close()


def test_a_save_whose_thread_died_is_not_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save that failed at once: its error raised from the wait, and no touch came of it."""
    touched: list[float] = []
    saving = ckpt.BackgroundSave()
    moved = ckpt.Moved()

    def broken() -> None:
        moved.add(1000)
        raise OSError("the store refused")

    saving.start(broken, moved=moved)
    time.sleep(0.2)  # the thread is dead before the wait looks
    with pytest.raises(OSError, match="refused"):
        saving.wait(lambda: touched.append(time.monotonic()), every=0.01)
    assert touched == []


def _slow_puts(monkeypatch: pytest.MonkeyPatch, pause: float, *, hang: float = 0.0) -> list[Any]:
    """LocalFileSystem.put_file made a slow remote store: 1 KiB blocks, each reported to the callback after
    ``pause`` seconds (as s3fs reports each part); with ``hang``, the first file first waits that long
    without a byte moving. The (start, end, remote path) of each upload."""
    spans: list[tuple[float, float, str]] = []

    def put_file(self: Any, lpath: str, rpath: str, callback: Any = None, **kwargs: Any) -> None:
        start = time.monotonic()
        time.sleep(hang if not spans else 0.0)
        data = Path(lpath).read_bytes()
        Path(rpath).parent.mkdir(parents=True, exist_ok=True)
        with open(rpath, "wb") as out:
            for at in range(0, len(data), 1024):
                time.sleep(pause)
                out.write(data[at : at + 1024])
                if callback is not None:
                    callback.relative_update(len(data[at : at + 1024]))
        spans.append((start, time.monotonic(), str(rpath)))

    monkeypatch.setattr(LocalFileSystem, "put_file", put_file)
    return spans


def _stopped_run(runner_job: Callable[..., Any]) -> Any:
    """The tiny job, beating every 50 ms, with the bot's stop request for it already beside its checkpoints:
    it saves at its first step, on the way out, waits for that save, reports it and exits 75."""
    from runner.contract.spec import EXIT_PREEMPTED
    from runner.train import run

    spec = _tiny(runner_job, checkpoint={"every_minutes": 60.0})
    folder = Path(spec.checkpoint.uri)
    folder.mkdir(parents=True, exist_ok=True)
    Path(request_uri(str(folder))).write_bytes(request(KEY, "job-save", "run-1", reason="user"))
    summary, code = run(spec)
    assert code == EXIT_PREEMPTED, summary
    return summary


def _tiny(runner_job: Callable[..., Any], **overrides: Any) -> Any:
    return runner_job(
        job_id="job-save",
        run_id="run-1",
        max_steps=4,
        seq_len=64,
        plateau={"enabled": False},
        samples={"count": 0},
        report={"callback_url": None, "every_seconds": 0.5, "heartbeat_seconds": 0.05},
        **overrides,
    )


def test_the_save_on_the_way_out_is_progress_while_its_bytes_move(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save the bot's stop request asks for, written on the way out and waited for, through a store that
    moves 1 KiB per 5 ms: it takes seconds, and no beat during it says more than a fraction of a second
    without progress (on 9a0c9c1 ``stalled_s`` grew through the whole upload)."""
    monkeypatch.setattr(ckpt, "WAIT_ROUND_S", 0.05)
    beats = Beats(monkeypatch, "job-save")
    spans = _slow_puts(monkeypatch, 0.005)
    _stopped_run(runner_job)
    assert spans and all("/checkpoint-" in path for _, _, path in spans)
    start, end = spans[0][0], spans[-1][1]
    assert end - start > 1.0, f"the save on the way out was not slow: {end - start:.2f} s"
    assert beats.stalled_between(start + 0.3, end) < 1.0


def test_a_save_on_the_way_out_that_moves_nothing_is_idleness(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same save through a store that holds its first file 2 s before a byte moves: the beats during
    that hold say the runner is making no progress (the bot stops a runner hung so for
    TUNEBOT_IDLE_STOP_MINUTES), though the save's thread is alive throughout."""
    monkeypatch.setattr(ckpt, "WAIT_ROUND_S", 0.05)
    beats = Beats(monkeypatch, "job-save")
    spans = _slow_puts(monkeypatch, 0.0, hang=2.0)
    _stopped_run(runner_job)
    start, end, _ = spans[0]
    assert beats.stalled_between(start, end) > 1.5


def test_the_last_timed_save_and_the_outputs_upload_are_progress_while_their_bytes_move(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that finishes: the timed save in flight that it waits for at its end, then the output built and
    uploaded, through a store that moves 1 KiB per 15 ms. From the first byte uploaded to the last no beat
    says more than a fraction of a second without progress."""
    from runner.contract.spec import EXIT_OK
    from runner.train import run

    monkeypatch.setattr(ckpt, "WAIT_ROUND_S", 0.05)
    beats = Beats(monkeypatch, "job-save")
    spans = _slow_puts(monkeypatch, 0.015)
    summary, code = run(_tiny(runner_job, checkpoint={"every_minutes": 1e-9, "keep": 10}))
    assert code == EXIT_OK and summary.status == "finished", summary
    output = [span for span in spans if "/output/" in span[2]]
    assert output and any("/checkpoint-" in path for _, _, path in spans)
    assert output[-1][1] - output[0][0] > 1.0, "the output's upload was not slow"
    assert beats.stalled_between(spans[0][0] + 0.3, spans[-1][1]) < 1.0


def test_each_token_of_a_sample_answer_is_progress(data_tiny_llama: Any, data_tokenizer: Any) -> None:
    """The samples both models answer (before the first step, after the last) are one forward per token, for
    every prompt: minutes on a large model. Each token generated calls ``progress`` (the trainer's touch)."""
    import contextlib

    import torch

    from runner.samples import Prompt, answer

    calls: list[int] = []
    prompts = [Prompt(ids=data_tokenizer("Hello world")["input_ids"], text="Hello world")]
    answers = answer(
        data_tiny_llama(),
        prompts,
        data_tokenizer,
        device=torch.device("cpu"),
        max_new_tokens=6,
        precision=contextlib.nullcontext,
        progress=lambda: calls.append(1),
    )
    assert len(answers) == 1 and 1 <= len(calls) <= 6
