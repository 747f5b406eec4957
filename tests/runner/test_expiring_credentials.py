"""A runner whose storage credentials expire still finishes: it switches to renewed ones, or it saves and
exits 77 in time to be relaunched with fresh ones (issue 19, item 1)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner import credentials
from runner.contract.integrity import CREDENTIALS, sign
from runner.contract.spec import EXIT_CREDENTIALS, EXIT_OK
from runner.credentials import Watcher, margin_for

KEY = bytes.fromhex("7c" * 32)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


NEW = {
    "AWS_ACCESS_KEY_ID": "ASIANEW",
    "AWS_SECRET_ACCESS_KEY": "new-secret",
    "AWS_SESSION_TOKEN": "new-token",
}


def renewal(path: Path, *, job_id: str = "j1", expires_at: float, key: bytes = KEY) -> None:
    """The object as the bot leaves it: signed with the run's key and sealed to the run (issue 28)."""
    from bot.storage.renewal import renewal_object

    path.write_bytes(renewal_object(key, job_id, NEW, expires_at))


def plain_renewal(path: Path, *, expires_at: float, key: bytes = KEY) -> None:
    """The object as the bot left it before issue 28: signed, but readable by whoever reads the folder."""
    body = {"version": 1, "job_id": "j1", "expires_at": expires_at, "env": NEW}
    path.write_text(json.dumps(sign(key, CREDENTIALS, body)))


def test_renewed_credentials_are_taken_from_half_life_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEBOT_CREDENTIALS_EXPIRE_AT", "0")  # the switch rewrites it: restored afterwards
    for name, value in {
        "AWS_ACCESS_KEY_ID": "ASIAOLD",
        "AWS_SECRET_ACCESS_KEY": "old",
        "AWS_SESSION_TOKEN": "t",
        "TUNEBOT_JOB_KEY": KEY.hex(),
    }.items():
        monkeypatch.setenv(name, value)
    clock, expiring = Clock(1000.0), []
    uri = tmp_path / "credentials.json"
    watcher = Watcher("j1", 1000.0 + 3600, str(uri), lambda: expiring.append(True), clock=clock)
    before = credentials.generation
    renewal(uri, expires_at=1000.0 + 7200)
    assert (
        watcher.step(KEY) is not None and os.environ["AWS_ACCESS_KEY_ID"] == "ASIAOLD"
    )  # not read before half-life
    clock.t = 1000.0 + 1900
    renewal(uri, expires_at=1000.0 + 7200, key=bytes.fromhex("aa" * 32))  # another job's key: ignored
    watcher.step(KEY)
    renewal(uri, job_id="j2", expires_at=1000.0 + 7200)  # this job's key, another job: ignored
    watcher.step(KEY)
    plain_renewal(uri, expires_at=1000.0 + 7200)  # signed but not sealed: readable by others, so ignored
    watcher.step(KEY)
    assert os.environ["AWS_ACCESS_KEY_ID"] == "ASIAOLD" and credentials.generation == before
    renewal(uri, expires_at=1000.0 + 7200)
    assert watcher.step(KEY) == 0.0
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SESSION_TOKEN"]) == ("ASIANEW", "new-token")
    assert os.environ["TUNEBOT_CREDENTIALS_EXPIRE_AT"] == "8200" and credentials.generation == before + 1
    # Nothing newer again, until only the margin is left: then the runner stops in time.
    clock.t = 8200 - margin_for(7200 - 1900) - 1
    assert watcher.step(KEY) is not None and not expiring
    clock.t += 2
    assert watcher.step(KEY) is None and expiring == [True]


@pytest.mark.slow
def test_a_runner_not_renewed_saves_and_exits_77_then_resumes(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runner.train import run

    spec = runner_job(
        max_steps=2000,
        seq_len=128,
        grad_accum=1,
        plateau={"enabled": False},
        checkpoint={"every_minutes": 60},
        report={"every_seconds": 0.2},
    )
    monkeypatch.setenv("TUNEBOT_JOB_KEY", KEY.hex())
    monkeypatch.setenv("TUNEBOT_CREDENTIALS_EXPIRE_AT", f"{time.time() + 9:.0f}")  # stops ~4 s before
    summary, code = run(spec)
    assert code == EXIT_CREDENTIALS and summary.status == "preempted", summary
    assert 0 < summary.steps < 2000
    saved = sorted(p.name for p in Path(spec.checkpoint.uri).glob("checkpoint-*"))
    assert saved == [f"checkpoint-{summary.steps}"]
    events = json.loads((Path(spec.checkpoint.uri) / "progress.json").read_text())["events"]
    assert events[-1]["kind"] == "preempted"
    assert events[-1]["message"] == "storage credentials expiring: saved and exiting"
    # Relaunched with fresh credentials: resumes where it stopped.
    monkeypatch.setenv("TUNEBOT_CREDENTIALS_EXPIRE_AT", f"{time.time() + 3600:.0f}")
    again, code = run(spec.model_copy(update={"max_steps": summary.steps + 3}))
    assert (
        code == EXIT_OK and again.resumed_from and again.resumed_from.endswith(f"checkpoint-{summary.steps}")
    )
