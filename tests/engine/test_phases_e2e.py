"""Quote against run, phase by phase (issue 36 item 1), end to end on this machine: a job quoted on the local
provider, run by the real runner, ends with `status JOB`'s card setting each phase's quote beside what the
runner reported, the phases adding up to the billed wall clock."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.chat import cards
from bot.planner.request import EstimateRequest
from bot.settings import Settings
from runner.contract.phases import PHASES


@pytest.mark.slow
def test_the_finished_card_sets_the_quote_against_the_run_phase_by_phase(tmp_path: Path) -> None:
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    local = LocalProvider(workdir=tmp_path / "local", price_per_hour=50.0, prewarm=False)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'phases.db'}", providers={"local": local})
    req = EstimateRequest(
        model=str(tiny / "model"),
        dataset=str(tiny / "data.jsonl"),
        gpu="cpu",
        seq_len=256,
        max_steps=12,
        eval_split=0.1,  # a base eval, evals, samples: every phase a user's default run has
        samples=2,
        sample_tokens=8,
    )
    est = eng.estimate(req)
    (offer,) = [o for o in est.offers if o.provider == "local"]
    # The quote is the whole run by phase: its phases add up to the hours it is priced at.
    assert offer.phases is not None and est.time.phases == offer.phases
    assert sum(offer.phases.values()) == pytest.approx(offer.hours * 3600, abs=0.4)
    # The suite's runners log to W&B offline (tests/conftest.py), as this bot's setting says: its start is
    # priced, as the runner reports it, in its own phase (not read into the start-up's readings).
    assert settings.wandb_mode == "offline"
    names = (
        "start",
        "data",
        "wandb",
        "base_eval",
        "warmup",
        "steps",
        "optimizer",
        "evals",
        "samples",
        "output",
    )
    for name in names:
        assert offer.phases[name] > 0, (name, offer.phases)
    job = eng.create_job(req, user="alice", estimate=est, max_cost=5.0)
    assert job.state == "running", job.message
    deadline = time.time() + 300
    view = eng.get_job(job.job_id)
    while time.time() < deadline and view.state not in ("succeeded", "failed", "stopped"):
        time.sleep(0.5)
        eng.tick()
        view = eng.get_job(job.job_id)
    eng.close()
    assert view.state == "succeeded", view.message
    assert view.quoted_phases == offer.phases
    ran, billed = view.run_phases, view.billed_seconds
    assert ran is not None and billed is not None
    assert set(ran) == set(PHASES)
    # Every billed second is in a phase the runner reported, bar the process's spawn and its exit.
    assert billed - 1.5 <= sum(ran.values()) <= billed + 0.5, (sum(ran.values()), billed, ran)
    for name in ("load", *names):
        assert ran[name] > 0, (name, ran)  # every phase the run went through, reported
    table = cards.phases_table(view)
    assert table is not None
    rows = {row[0]: row for row in table.rows}
    assert {"start-up", "steps"} <= set(rows), rows  # the phases of a tenth of a second and more
    for label, quoted, run, _ in table.rows[:-1]:
        assert (quoted != "-" or label.startswith("not reported")) and run != "-", (label, rows)
    for label in ("start-up", "steps", "total (billed)"):
        assert rows[label][3].startswith("x"), rows[label]  # a finished job says run/quote
    assert rows["total (billed)"][2] == cards.seconds_text(billed)
    # The status card shows it (`status JOB`, the card edited in the thread at the end).
    card = cards.job_card(view)
    assert table in card.parts


def test_every_door_prices_w_and_b_as_this_bots_setting_logs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate's request carries how the bot's runners will log to W&B (launch.wandb_mode: a key logs
    online, WANDB_MODE asks for less), so its start is priced where it runs and nowhere else."""
    from bot.engine.launching.offers import with_wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    req = EstimateRequest(model="m")
    assert with_wandb(req, Settings()).wandb == "disabled"  # no key: W&B is off, nothing priced
    assert with_wandb(req, Settings(WANDB_API_KEY="k")).wandb == "online"
    assert with_wandb(req, Settings(WANDB_API_KEY="k", WANDB_MODE="offline")).wandb == "offline"
    assert with_wandb(req, Settings(WANDB_MODE="disabled", WANDB_API_KEY="k")).wandb == "disabled"
