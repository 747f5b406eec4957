"""A sweep's run pauses at its stage boundary (issue 36, item 4): it evaluates, saves and reports there, then
waits for the sweep's decision; stopped, it leaves with the boundary's checkpoint, never a step past it; kept
(a decision signed with its run's key, runner/contract/stage.py), it trains on. A decision signed with any
other key changes nothing.

On 9a0c9c1 the runner had no boundary: the runs a sweep stopped at step 8 trained on to steps 19 and 28
before the stop reached them.
"""

from __future__ import annotations

import json
import queue
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract.spec import EXIT_OK, EXIT_PREEMPTED, EventKind, parse_progress
from runner.contract.stage import decision, decision_uri

KEY, OTHER = bytes(range(32)), bytes(range(1, 33))
JOB = {
    "run_id": "r1",
    "max_steps": 8,
    "seq_len": 128,
    "micro_batch_size": 4,
    "grad_accum": 1,
    "report": {"every_seconds": 0.1, "token": "t"},
    "stages": {"steps": [4], "poll_seconds": 0.05},
}


class Lines:
    """The runner's stdout, line by line, as it comes."""

    def __init__(self, proc: Any) -> None:
        self.proc, self.seen, self._q = proc, [], queue.Queue()  # type: ignore[var-annotated]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def until(self, text: str, *, count: int = 1, timeout: float = 240) -> None:
        """Read until ``text`` has shown ``count`` more times (AssertionError at the end of the output)."""
        found = 0
        while found < count:
            line = self._q.get(timeout=timeout)
            assert line is not None, "\n".join(self.seen[-30:]) + self.proc.stderr.read()[-3000:]
            self.seen.append(line)
            found += text in line

    def rest(self) -> list[str]:
        while (line := self._q.get(timeout=240)) is not None:
            self.seen.append(line)
        return self.seen


@pytest.fixture
def staged(runner_job: Callable[..., Any], runner_tiny_dir: Path, tmp_path: Path, write_spec: Any) -> Any:
    data = tmp_path / "small.jsonl"
    data.write_text("".join((runner_tiny_dir / "data.jsonl").read_text().splitlines(keepends=True)[:120]))
    spec = runner_job(dataset={"uri": str(data), "eval_fraction": 0.1}, **JOB)
    return spec, write_spec(spec)


def _start(runner_process: Callable[..., Any], path: Path) -> tuple[Any, Lines]:
    run = runner_process(path, env={"TUNEBOT_JOB_KEY": KEY.hex()})
    return run, Lines(run.proc)


def _trained(lines: list[str]) -> int:
    return max((int(x.split()[1].split("/")[0]) for x in lines if x.startswith("step ")), default=0)


@pytest.mark.slow
def test_a_run_waits_at_its_boundary_until_the_sweep_keeps_it(staged: Any, runner_process: Any) -> None:
    spec, path = staged
    run, lines = _start(runner_process, path)
    lines.until("stage boundary at step 4: waiting for the sweep's decision")
    target = decision_uri(spec.checkpoint.uri)
    # A decision no sweep made (another key) is read and refused: the run keeps waiting, reporting so.
    Path(target).write_bytes(decision(OTHER, spec.job_id, spec.run_id, through=4, max_cost=5.0))
    lines.until("waiting at the stage boundary (step 4)", count=3)
    reported = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_text())
    assert max(e.step for e in reported) == 4 and _trained(lines.seen) <= 4, lines.seen  # not a step more
    Path(target).write_bytes(decision(KEY, spec.job_id, spec.run_id, through=4, max_cost=5.0))
    out = lines.rest()
    assert run.proc.wait(60) == EXIT_OK, out[-10:]
    summary = json.loads(out[-1])
    assert summary["status"] == "finished" and summary["steps"] == 8, summary
    assert "stage boundary at step 4: the sweep keeps this run" in out
    # What the sweep ranks on and resumes from: the eval at step 4 and its checkpoint, in one report.
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_text())
    (at_boundary,) = [e for e in events if e.kind is EventKind.checkpoint and e.step == 4]
    assert at_boundary.evals and at_boundary.evals[-1][0] == 4 and at_boundary.manifest_sha256
    assert at_boundary.checkpoint_uri and at_boundary.checkpoint_uri.endswith("checkpoint-4")


@pytest.mark.slow
def test_a_run_the_sweep_stops_never_trains_past_its_boundary(staged: Any, runner_process: Any) -> None:
    spec, path = staged
    run, lines = _start(runner_process, path)
    lines.until("stage boundary at step 4: waiting for the sweep's decision")
    run.proc.send_signal(signal.SIGTERM)  # what a sweep's stop is to a host
    out = lines.rest()
    assert run.proc.wait(60) == EXIT_PREEMPTED, out[-10:]
    summary = json.loads(out[-1])
    assert summary["status"] == "preempted" and summary["steps"] == 4, summary
    assert _trained(out) <= 4
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_text())
    assert events[-1].kind is EventKind.preempted and events[-1].checkpoint_uri.endswith("checkpoint-4")
