"""The local provider only where it belongs (issue 10: `tunebot serve` offered an 8B QLoRA on the bot's own
CPU, "Launch cheapest ($0.90) ... local cpu x1 about 9.0 h"; the console's cheapest row said $1.20 while
its button said "Launch cheapest ($161.19)")."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.chat import cards
from bot.engine.api import EngineError
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate, RankedOffer
from bot.settings import Settings, get_settings

from .conftest import TRAIN_JSONL
from .fakes import make_estimate


def local_engine(tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider

    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), **env)
    local = LocalProvider(workdir=tmp_path / "local")
    return Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"local": local})


def test_serve_has_no_local_provider_unless_a_setting_enables_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.commands.chat_commands import _runtime

    _, console_engine, _ = _runtime("me")
    _, serving_engine, _ = _runtime(serving=True)
    assert "local" in console_engine.providers and "local" not in serving_engine.providers
    monkeypatch.setenv("TUNEBOT_LOCAL_PROVIDER", "1")
    get_settings.cache_clear()
    _, enabled, _ = _runtime(serving=True)
    assert "local" in enabled.providers
    monkeypatch.setenv("TUNEBOT_LOCAL_PROVIDER", "0")
    get_settings.cache_clear()
    _, off, _ = _runtime("me")
    assert "local" not in off.providers
    for eng in (console_engine, serving_engine, enabled, off):
        eng.close()


def test_a_job_of_hours_is_never_offered_on_this_machine(tmp_path: Path) -> None:
    eng = local_engine(tmp_path)
    # A 1B model: its memory fits the machine even at the top of the estimate's range (issue 11), so it is
    # the hours, not the memory, that keep it off this machine.
    req = EstimateRequest(model="llama-3.2-1b", method="qlora", tokens=20_000_000, dataset=None)
    est = eng.estimate(req)
    (local,) = [o for o in est.offers if o.provider == "local"]
    assert not local.fits and local.labels == []
    assert "on this machine's CPU" in local.reason and "TUNEBOT_LOCAL_MAX_HOURS" in local.reason
    reply = cards.estimate_reply(est, estimate_id="e1", launching=True)
    assert not any(
        b.action.startswith("launch_") for p in reply.parts if hasattr(p, "buttons") for b in p.buttons
    )
    with pytest.raises(EngineError):
        job_req = req.model_copy(update={"dataset": TRAIN_JSONL, "tokens": None})
        eng.create_job(job_req, user="me", estimate=est)
    eng.close()


def test_a_short_job_is_still_offered_here(tmp_path: Path) -> None:
    eng = local_engine(tmp_path)
    est = eng.estimate(EstimateRequest(model="llama-3.2-1b", tokens=2_000, seq_len=256))
    (local,) = [o for o in est.offers if o.provider == "local"]
    assert local.fits and "cheapest" in local.labels, local.reason
    eng.close()


def _offer(provider: str, gpu: str, total: float, *, labels: list[str], reason: str) -> RankedOffer:
    return RankedOffer(
        provider=provider,
        offer_id=f"{provider}-1",
        gpu=gpu,
        gpu_count=1,
        gpu_memory_gb=24,
        interruptible=False,
        price_per_hour=total / 2,
        hours=2.0,
        total_cost=total,
        fits=True,
        reason=reason,
        labels=labels,
    )


def test_a_launch_button_names_the_row_offer_and_price_it_launches() -> None:
    offers = [
        _offer("vast", "rtx-4090", 1.20, labels=[], reason="fits; set VAST_API_KEY to launch on vast"),
        _offer("local", "cpu", 161.19, labels=["cheapest", "safest"], reason="recommended: cheapest"),
    ]
    est: Estimate = make_estimate([]).model_copy(update={"offers": offers})
    reply = cards.estimate_reply(est, estimate_id="e1")
    table = next(p for p in reply.parts if hasattr(p, "rows"))
    buttons = [
        b for p in reply.parts if hasattr(p, "buttons") for b in p.buttons if b.action == "launch_cheapest"
    ]
    assert table.rows[1][:3] == ["2", "local", "cpu x1"]
    assert table.rows[1][table.columns.index("total")] == "$161.19"
    assert buttons[0].label == "Launch cheapest: #2 local cpu x1 ($161.19)"
    assert table.rows[0][-1] == "fits; set VAST_API_KEY to launch on vast"  # row 1 says why it has no button


def test_a_bot_only_install_offers_no_local_job_and_says_why(tmp_path: Path) -> None:
    """A bot-only install (`pip install .` without [runner]): torch cannot be imported. Local CPU jobs used to
    be offered and launched there, then died at once; now this machine is not offered, and the estimate and
    launch say why (issue 27). The bot finds out without importing torch."""
    import json
    import os
    import subprocess
    import sys

    from runner.tiny import make_tiny

    model = make_tiny(tmp_path / "tiny")
    boot = tmp_path / "no-torch"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # not installed\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(boot), os.environ.get("PYTHONPATH", "")]),
        "TUNEBOT_DATA_DIR": str(tmp_path / "data"),
        "TUNEBOT_LOCAL_PROVIDER": "1",
        "COLUMNS": "200",
    }
    data = f"dataset={model.parent / 'data.jsonl'}"
    request = [str(model.parent / "model"), data, "steps=2", "--gpu", "cpu"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", "from bot.cli import main; main()", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)

    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "None", probe  # the sandbox: torch is not importable
    est = cli("estimate", *request, "--json")
    assert est.returncode == 0, est.stderr[-2000:]
    shown = json.loads(est.stdout)
    assert not [o for o in shown["offers"] if o["provider"] == "local"]
    why = " ".join(shown["assumptions"])
    assert "this machine's CPU is not offered" in why and "torch is not installed" in why
    assert "tunebot[runner]" in why
    launched = cli("launch", *request)
    assert launched.returncode == 2, launched.stdout[-2000:] + launched.stderr[-2000:]
    assert "torch is not installed" in launched.stderr and "Traceback" not in launched.stderr
    assert "drop gpu=cpu" in launched.stderr and "a bigger GPU" not in launched.stderr  # not a memory problem
    jobs = cli("jobs", "--json")
    assert jobs.returncode == 0 and json.loads(jobs.stdout) == []  # nothing was created to die
