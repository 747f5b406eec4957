"""W&B never holds up training: an unreachable W&B is never asked (a TCP probe of at most 2 s), a silent one
gets one online attempt bounded by a 3 s init timeout (wandb's own is 90 s), then the run logs offline and
says so once; WANDB_MODE=offline in the runner's environment is honoured over the spec's online mode.

The tests check that mechanism (what was asked of wandb and of the network, and with which timeouts), not the
clock: the seconds it costs are measured by bench/wandb_unreachable.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.wandb_log import INIT_TIMEOUT_S, PROBE_TIMEOUT_S, wanted_mode

FAKE_KEY = "0123456789abcdef" * 2 + "01234567"  # 40 characters, the shape of a W&B key

# WandbLog.start in a fresh process (wandb starts a service process and keeps global state): what it ended
# up as, where the offline run went once finished, and what it asked for on the way: every wandb.setup /
# wandb.init (mode, init_timeout, x_disable_viewer) and every TCP connection attempt (address, timeout).
_START = """
import json, socket, sys
import wandb
from runner.contract.spec import JobSpec
from runner.wandb_log import WandbLog
calls = []
def _settings(settings):
    if settings is None:
        return None
    return {"init_timeout": getattr(settings, "init_timeout", None),
            "x_disable_viewer": getattr(settings, "x_disable_viewer", None)}
real_setup, real_init, real_connect = wandb.setup, wandb.init, socket.create_connection
def setup(settings=None, **kw):
    calls.append({"call": "setup", "settings": _settings(settings)})
    return real_setup(settings=settings, **kw)
def init(*args, **kw):
    call = {"call": "init", "mode": kw.get("mode"), "settings": _settings(kw.get("settings"))}
    calls.append(call)
    try:
        return real_init(*args, **kw)
    except Exception as exc:
        call["raised"] = type(exc).__name__
        raise
def connect(address, timeout=None, *args, **kw):
    calls.append({"call": "connect", "address": list(address), "timeout": timeout})
    return real_connect(address, timeout, *args, **kw)
wandb.setup, wandb.init, socket.create_connection = setup, init, connect
spec = JobSpec.model_validate_json(open(sys.argv[1]).read())
log = WandbLog()
run_id = log.start(spec, None, {"lr": 1e-3})
wandb.setup, wandb.init, socket.create_connection = real_setup, real_init, real_connect
log.log({"train/loss": 1.5}, step=1)
log.finish()
saved = log.save_offline(spec.checkpoint.uri) if hasattr(log, "save_offline") else None
print(json.dumps({"run_id": run_id, "mode": getattr(log, "mode", None), "note": getattr(log, "note", None),
                  "url": log.url, "saved": saved, "calls": calls}))
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
    """A start with WANDB_MODE=offline in the environment (the spec asks for online)."""
    spec = runner_job(wandb={"mode": "online", "project": "p", "run_id": "tiny-offline"})
    env = {
        "WANDB_API_KEY": FAKE_KEY,
        "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}",
        "WANDB_MODE": "offline",
    }
    return _start(write_spec(spec, "offline.json"), tmp_path / "offline", env)


def _calls(out: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [c for c in out["calls"] if c["call"] == kind]


def _probes(out: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The TCP connections tried to W&B's server (wandb's own service runs on other ports)."""
    return [c for c in _calls(out, "connect") if c["address"] == ["127.0.0.1", port]]


def test_unreachable_wandb_costs_seconds_then_logs_offline(runner_job, write_spec, tmp_path: Path) -> None:
    """W&B's URL is a closed loopback port: wandb.init alone used to block ~93 s (its 90 s init timeout and
    an account lookup before it), then logged nothing. Now one TCP probe (2 s at most) finds it unreachable,
    wandb is never asked to go online, the run logs offline, says so once, and is kept beside the
    checkpoints. (What it costs against an offline start: bench/wandb_unreachable.py.)"""
    base = _offline_start(runner_job, write_spec, tmp_path)
    spec = runner_job(wandb={"mode": "online", "project": "p", "run_id": "tiny-run-1"})
    port = _closed_port()
    env = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": f"http://127.0.0.1:{port}"}
    out = _start(write_spec(spec), tmp_path, env)
    assert [p["timeout"] for p in _probes(out, port)] == [PROBE_TIMEOUT_S] and PROBE_TIMEOUT_S <= 2.0, out
    assert [c["mode"] for c in _calls(out, "init")] == ["offline"], out["calls"]  # no online attempt at all
    assert out["mode"] == "offline" and out["url"] is None and out["run_id"] == "tiny-run-1"
    assert "W&B is unreachable" in out["note"] and "logging offline" in out["note"], out["note"]
    assert out["stdout"].count("note: W&B is unreachable") == 1, out["stdout"]  # said once
    saved = Path(out["saved"])
    assert saved.parent == Path(spec.checkpoint.uri) / "wandb" and saved.name.startswith("offline-run-")
    assert list(saved.glob("*.wandb")), list(saved.rglob("*"))  # the run's log, what `wandb sync` uploads
    # WANDB_MODE=offline is honoured over the spec's online mode (no probe, no online attempt), and is no
    # news for the thread
    assert base["mode"] == "offline" and base["note"] is None, base
    assert [c["mode"] for c in _calls(base, "init")] == ["offline"], base["calls"]
    assert _calls(base, "setup") == [] and "note:" not in base["stdout"], base
    assert base["saved"] and Path(base["saved"]).is_dir()


@pytest.mark.slow  # waits out the 3 s init timeout on purpose
def test_silent_wandb_server_costs_its_init_timeout_not_90_s(runner_job, write_spec, tmp_path: Path) -> None:
    """A W&B server that takes the connection and never answers: the probe connects, so wandb gets exactly
    one online attempt, bounded by the init timeout (3 s; wandb's own default is 90 s) with the account
    lookup (not bounded by it) switched off first; it fails, and the run logs offline and says so once."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the handshakes; nothing ever reads or answers
    port = silent.getsockname()[1]
    try:
        spec = runner_job(wandb={"mode": "online", "project": "p", "run_id": "tiny-run-3"})
        env = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": f"http://127.0.0.1:{port}"}
        # the subprocess's 45 s limit is half of wandb's own 90 s: an attempt not cut at 3 s fails the test
        out = _start(write_spec(spec), tmp_path, env)
    finally:
        silent.close()
    assert [p["timeout"] for p in _probes(out, port)] == [PROBE_TIMEOUT_S], out["calls"]
    wandb_calls = [c for c in out["calls"] if c["call"] in ("setup", "init")]
    assert wandb_calls[0]["call"] == "setup" and wandb_calls[0]["settings"]["x_disable_viewer"] is True
    online = [c for c in wandb_calls if c["call"] == "init" and c["mode"] == "online"]
    assert len(online) == 1, wandb_calls  # one attempt, then offline
    assert online[0]["settings"]["init_timeout"] == INIT_TIMEOUT_S == 3.0 and online[0].get("raised"), online
    assert wandb_calls.index(online[0]) == 1 and wandb_calls[-1]["mode"] == "offline", wandb_calls
    assert "raised" not in wandb_calls[-1], wandb_calls
    assert out["mode"] == "offline" and "did not start within 3 s" in out["note"], out["stdout"]
    assert out["stdout"].count("note: W&B did not start within") == 1, out["stdout"]  # said once
    assert Path(out["saved"]).parent == Path(spec.checkpoint.uri) / "wandb", out


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
