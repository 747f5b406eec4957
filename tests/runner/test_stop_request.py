"""The bot's stop request (runner/contract/stop.py): the runner obeys its own run's, signed with its key, and
nothing else.

A cloud gives the bot no signal path to the runner: it writes a signed stop object beside the run's
checkpoints, and the runner's reporter looks for it at every heartbeat (runner/report.py). The one the bot
signs makes the run save, report its checkpoint and exit 75, as SIGTERM does; one that another run's host (or
anyone who can write the bucket) plants is ignored and the run trains on. On 9a0c9c1 there was no such object:
nothing the bot could write stopped a cloud runner gracefully.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract.integrity import KEY_ENV
from runner.contract.spec import EXIT_OK, EXIT_PREEMPTED, parse_progress
from runner.contract.stop import asked, request, request_uri

KEY, OTHER = secrets.token_bytes(32), secrets.token_bytes(32)
JOB, RUN = "j-stop", "run-2"


@pytest.mark.parametrize(
    ("what", "raw", "expected"),
    [
        ("the bot's request for this run", request(KEY, JOB, RUN, reason="user"), "user"),
        ("signed with another run's key", request(OTHER, JOB, RUN, reason="user"), None),
        ("unsigned", request(None, JOB, RUN, reason="user"), None),
        ("for another run of the job", request(KEY, JOB, "run-1", reason="user"), None),
        ("for another job", request(KEY, "j-other", RUN, reason="user"), None),
        ("not JSON", b"stop now", None),
        ("too large to be the bot's", request(KEY, JOB, RUN, reason="user") + b" " * 5000, None),
    ],
)
def test_only_the_runs_own_signed_request_is_obeyed(what: str, raw: bytes, expected: str | None) -> None:
    assert asked(raw, KEY, JOB, RUN) == expected, what


def test_a_reason_is_one_of_the_bots_words_never_free_text() -> None:
    assert asked(request(KEY, JOB, RUN, reason="sweep"), KEY, JOB, RUN) == "sweep"
    assert asked(request(KEY, JOB, RUN, reason="x\n" * 50), KEY, JOB, RUN) == "stop"


def _run(spec: Any) -> tuple[Any, int, list[Any]]:
    from runner.train import run

    summary, code = run(spec)
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())
    return summary, code, events


def _spec(runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, stop: bytes) -> Any:
    """The tiny job as run ``RUN`` with its key, beating every 50 ms, ``stop`` in its checkpoint folder."""
    monkeypatch.setenv(KEY_ENV, KEY.hex())
    spec = runner_job(
        job_id=JOB,
        run_id=RUN,
        max_steps=30,
        seq_len=64,
        report={"callback_url": None, "every_seconds": 0.5, "heartbeat_seconds": 0.05},
        checkpoint={"every_minutes": 60.0},  # no timed save: any checkpoint is the stop's
    )
    folder = Path(spec.checkpoint.uri)
    folder.mkdir(parents=True, exist_ok=True)
    Path(request_uri(str(folder))).write_bytes(stop)
    return spec


def test_the_bots_request_saves_reports_and_exits_as_preempted(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary, code, events = _run(_spec(runner_job, monkeypatch, request(KEY, JOB, RUN, reason="user")))
    assert code == EXIT_PREEMPTED and summary.status == "preempted", summary  # not 77: no credentials issue
    last = events[-1]
    assert last.kind.value == "preempted"
    assert last.message == "stop requested by the bot (user): saved and exiting"
    assert 0 < last.step < 30 and last.step == summary.steps
    assert last.checkpoint_uri and last.checkpoint_uri.endswith(f"checkpoint-{last.step}")
    assert (Path(last.checkpoint_uri) / "COMPLETE").exists() and last.manifest_sha256


def test_a_forged_request_is_read_and_ignored_the_run_trains_to_its_end(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another run's host writes the bucket (static credentials) and sign with its own key, not this run's."""
    forged = request(OTHER, JOB, RUN, reason="user")
    with caplog.at_level(logging.WARNING, logger="runner.report"):
        summary, code, events = _run(_spec(runner_job, monkeypatch, forged))
    assert "a stop request this run's key did not sign, or not for this run: ignored" in caplog.text
    assert code == EXIT_OK and summary.status == "finished" and summary.steps == 30, summary
    assert not [e for e in events if e.kind.value == "preempted"]
