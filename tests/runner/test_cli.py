"""`tunebot-runner`: bad input is a message and exit 2; the summary is always the last stdout line."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.cli import run
from runner.contract.spec import EXIT_BAD_SPEC, EXIT_OK, parse_progress


def _summary(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


def test_a_spec_that_is_not_json_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "job.json"
    bad.write_text("{not json")
    assert run(["--spec", str(bad)]) == EXIT_BAD_SPEC
    summary, err = _summary(capsys)
    assert summary["status"] == "invalid" and "invalid job spec" in summary["message"]
    assert "Traceback" not in err


def test_a_spec_with_wrong_fields_names_them(
    runner_job: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = json.loads(runner_job().model_dump_json())
    spec["learning_rate"] = -1
    spec["method"] = "dpo"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    assert run(["--spec", str(path)]) == EXIT_BAD_SPEC
    summary, _ = _summary(capsys)
    assert "learning_rate" in summary["message"] and "method" in summary["message"]


def test_no_spec_at_all(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TUNEBOT_JOB_SPEC", raising=False)
    assert run([]) == EXIT_BAD_SPEC
    summary, err = _summary(capsys)
    assert summary["status"] == "invalid" and "TUNEBOT_JOB_SPEC" in err


def test_a_malformed_dataset_line_is_invalid_and_named(
    runner_job: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "a"\n')
    spec = runner_job(dataset={"uri": str(data)})
    monkeypatch.setenv("TUNEBOT_JOB_SPEC", spec.model_dump_json())  # the spec as JSON in the environment
    assert run([]) == EXIT_BAD_SPEC
    summary, err = _summary(capsys)
    assert summary["status"] == "invalid" and summary["steps"] == 0
    assert f"{data}:2" in summary["message"]
    assert "Traceback" not in err


def test_the_console_script_exits_2_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "job.json"
    bad.write_text(json.dumps({"job_id": "x"}))
    out = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--spec", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == EXIT_BAD_SPEC
    assert json.loads(out.stdout.strip().splitlines()[-1])["status"] == "invalid"
    assert "Traceback" not in out.stderr and "base_model" in out.stderr


def test_a_receiver_that_is_down_does_not_stop_training(
    runner_job: Callable[..., Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training never waits on the bot: every POST is made by the reporter's sender thread (never the training
    loop), and once the receiver is found down each later event gets a single try, then is dropped; the
    progress object has every event."""
    import socket
    import threading

    import httpx

    import runner.report as report

    attempts: list[tuple[str, int]] = []  # (thread, seq) of every POST to the callback

    class Recording(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            attempts.append((threading.current_thread().name, json.loads(request.content)["seq"]))
            return super().handle_request(request)

    made: list[Any] = []

    class Reporter(report.Reporter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "transport": Recording()})
            made.append(self)

    monkeypatch.setattr(report, "Reporter", Reporter)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = runner_job(
        max_steps=6,
        seq_len=128,
        grad_accum=1,
        report={
            "callback_url": f"http://127.0.0.1:{port}/runner/events",
            "token": "t",
            "every_seconds": 0.01,
        },
    )
    path = Path(spec.checkpoint.uri).parent / "down.json"
    path.write_text(spec.model_dump_json())
    assert run(["--spec", str(path)]) == EXIT_OK
    summary, _ = _summary(capsys)
    assert summary["status"] == "finished" and summary["steps"] == 6
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    kinds = [e.kind.value for e in events]
    assert kinds[0] == "started" and kinds[-1] == "finished" and "progress" in kinds
    (reporter,) = made
    assert attempts and {thread for thread, _ in attempts} == {"tunebot-report"}, attempts
    tries = collections.Counter(seq for _, seq in attempts)
    first, *later = sorted(tries)
    assert 1 <= tries[first] <= 3 and all(tries[seq] == 1 for seq in later), tries  # down: one try each
    assert reporter.delivered == 0 and reporter.dropped >= len(tries), (reporter.delivered, reporter.dropped)


def test_a_base_model_folder_that_does_not_exist_is_invalid(
    runner_job: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.json"
    path.write_text(runner_job(base_model=str(tmp_path / "no-such-model")).model_dump_json())
    assert run(["--spec", str(path)]) == EXIT_BAD_SPEC
    summary, err = _summary(capsys)
    assert summary["status"] == "invalid" and "no-such-model" in summary["message"]
    assert "Traceback" not in err


def test_unknown_arguments_are_a_usage_error_with_a_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run(["--spec", "x.json", "--bogus"])
    assert exited.value.code == EXIT_BAD_SPEC
    summary, err = _summary(capsys)
    assert summary["status"] == "invalid" and "--bogus" in err
