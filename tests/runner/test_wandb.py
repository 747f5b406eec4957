"""W&B never holds up training: an unreachable W&B costs seconds (then the run logs offline, said once), and
WANDB_MODE=offline in the runner's environment is honoured over the spec's online mode."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runner.wandb_log import wanted_mode

FAKE_KEY = "0123456789abcdef" * 2 + "01234567"  # 40 characters, the shape of a W&B key

# WandbLog.start in a fresh process (wandb starts a service process and keeps global state): the time it
# takes, what it ended up as, and where the offline run went once finished.
_START = """
import json, sys, time
from runner.contract.spec import JobSpec
from runner.wandb_log import WandbLog
spec = JobSpec.model_validate_json(open(sys.argv[1]).read())
log = WandbLog()
t = time.monotonic()
run_id = log.start(spec, None, {"lr": 1e-3})
elapsed = time.monotonic() - t
log.log({"train/loss": 1.5}, step=1)
log.finish()
saved = log.save_offline(spec.checkpoint.uri) if hasattr(log, "save_offline") else None
print(json.dumps({"elapsed": elapsed, "run_id": run_id, "mode": getattr(log, "mode", None),
                  "note": getattr(log, "note", None), "url": log.url, "saved": saved}))
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the socket is: nothing listens there


def _start(spec_path: Path, tmp_path: Path, env: dict[str, str], timeout: float = 45) -> dict[str, Any]:
    full = {**os.environ, "WANDB_DIR": str(tmp_path / "wandb-dir"), "WANDB_SILENT": "true", **env}
    if "WANDB_MODE" not in env:
        full.pop("WANDB_MODE", None)
    (tmp_path / "wandb-dir").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _START, str(spec_path)],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_seconds"] = time.monotonic() - started
    out["stdout"] = proc.stdout
    return out


def test_wanted_mode_lets_the_environment_ask_for_less() -> None:
    assert wanted_mode("online", {}) == "online"
    assert wanted_mode("online", {"WANDB_MODE": "offline"}) == "offline"
    assert wanted_mode("online", {"WANDB_MODE": "dryrun"}) == "offline"
    assert wanted_mode("online", {"WANDB_MODE": "disabled"}) == "disabled"
    assert wanted_mode("offline", {"WANDB_DISABLED": "true"}) == "disabled"
    assert wanted_mode("disabled", {"WANDB_MODE": "online"}) == "disabled"  # never more than asked
    assert wanted_mode("disabled", {"WANDB_MODE": "offline"}) == "disabled"


def _offline_start(runner_job: Any, write_spec: Any, tmp_path: Path) -> dict[str, Any]:
    """What starting W&B costs here with no network involved at all (WANDB_MODE=offline): wandb spawns its
    service process, which takes ~1 s on an idle machine and several on this shared 2-core one."""
    spec = runner_job(wandb={"mode": "online", "project": "p", "run_id": "tiny-offline"})
    env = {
        "WANDB_API_KEY": FAKE_KEY,
        "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}",
        "WANDB_MODE": "offline",
    }
    return _start(write_spec(spec, "offline.json"), tmp_path / "offline", env)


def test_unreachable_wandb_costs_seconds_then_logs_offline(runner_job, write_spec, tmp_path: Path) -> None:
    """W&B's URL is a closed loopback port: wandb.init alone used to block ~93 s (its 90 s init timeout and
    an account lookup before it), then logged nothing. Now unreachability itself costs well under a second
    more than an offline start, the run logs offline, says so, and is kept beside the checkpoints."""
    base = _offline_start(runner_job, write_spec, tmp_path)
    spec = runner_job(wandb={"mode": "online", "project": "p", "run_id": "tiny-run-1"})
    env = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}"}
    out = _start(write_spec(spec), tmp_path, env)
    timings = f"unreachable {out['elapsed']:.1f} s, offline {base['elapsed']:.1f} s"
    assert out["elapsed"] - base["elapsed"] < 2.0, timings
    assert out["elapsed"] < 15.0, timings  # the whole start, on a loaded shared machine (~1.5 s idle)
    assert out["mode"] == "offline" and out["url"] is None and out["run_id"] == "tiny-run-1"
    assert "W&B is unreachable" in out["note"] and "logging offline" in out["note"], out["note"]
    saved = Path(out["saved"])
    assert saved.parent == Path(spec.checkpoint.uri) / "wandb" and saved.name.startswith("offline-run-")
    assert list(saved.glob("*.wandb")), list(saved.rglob("*"))  # the run's log, what `wandb sync` uploads
    # WANDB_MODE=offline is honoured over the spec's online mode, and is no news for the thread
    assert base["mode"] == "offline" and base["note"] is None, base
    assert base["saved"] and Path(base["saved"]).is_dir()


@pytest.mark.slow  # waits out the 3 s init timeout on purpose
def test_silent_wandb_server_costs_its_init_timeout_not_90_s(runner_job, write_spec, tmp_path: Path) -> None:
    """A W&B server that takes the connection and never answers: the online attempt is cut at the init
    timeout (3 s; wandb's own default is 90 s), then the run logs offline."""
    base = _offline_start(runner_job, write_spec, tmp_path)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the handshakes; nothing ever reads or answers
    try:
        spec = runner_job(wandb={"mode": "online", "project": "p", "run_id": "tiny-run-3"})
        env = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        out = _start(write_spec(spec), tmp_path, env)
    finally:
        silent.close()
    timings = f"silent server {out['elapsed']:.1f} s, offline {base['elapsed']:.1f} s"
    # 3 s of init timeout, then wandb's service stopped for the offline run (~0.1 s idle, ~2 s loaded)
    assert out["mode"] == "offline" and "did not start within 3 s" in out["note"], out["stdout"]
    assert out["elapsed"] - base["elapsed"] < 6.0, timings


@pytest.mark.slow
def test_runner_with_unreachable_wandb_trains_and_says_so_once(
    runner_job, write_spec, runner_process, event_receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real runner on the CPU with W&B unreachable: it trains to the end, the `started` event carries
    the note for the thread (with where the offline run is kept), and W&B held it up for seconds."""
    spec = runner_job(
        max_steps=6,
        wandb={"mode": "online", "project": "p"},
        report={"callback_url": event_receiver.url, "token": "t0k", "every_seconds": 0.2},
    )
    env = {
        "WANDB_API_KEY": FAKE_KEY,
        "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
    }
    monkeypatch.delenv("WANDB_MODE", raising=False)  # tests/conftest.py sets offline for every test
    proc = runner_process(write_spec(spec), env=env, cwd=tmp_path)
    rc, summary = proc.finish(timeout=240)
    assert rc == 0 and summary["status"] == "finished", summary
    log = "\n".join(proc.lines)
    started = [body for _, body in event_receiver.received if body["kind"] == "started"]
    assert len(started) == 1 and "logging offline" in (started[0].get("wandb_note") or ""), log
    assert f"{spec.checkpoint.uri}/wandb/" in started[0]["wandb_note"]
    assert list((Path(spec.checkpoint.uri) / "wandb").glob("offline-run-*/*.wandb"))
