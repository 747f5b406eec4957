"""A local runner is not at the mercy of the bot's working directory (issue 27).

On eac3cff local runners started as `python -c "from runner.cli import main; main()"` in the bot's working
directory, so a file there named like a module (`runner.py`, `torch.py`) was imported instead of the real one.
Now the runner starts as `python -P -m runner.cli` in its instance's own folder; the job's local paths are
kept absolute (a relative `dataset=data.jsonl` means the same thing to whichever process relaunches it).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from bot.planner.request import EstimateRequest
from bot.settings import Settings

from .fakes import make_estimate

SHADOW = "raise SystemExit('shadowed: {name} from the bot working directory was imported')\n"


@pytest.mark.slow
def test_a_module_named_file_in_the_bots_directory_shadows_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    here = tmp_path / "where-the-bot-runs"
    here.mkdir()
    for name in ("runner", "torch", "json", "transformers"):
        (here / f"{name}.py").write_text(SHADOW.format(name=f"{name}.py"))
    shutil.copytree(tiny / "model", here / "model")
    shutil.copy(tiny / "data.jsonl", here / "data.jsonl")
    monkeypatch.chdir(here)
    local = LocalProvider(workdir=tmp_path / "local")
    eng = Engine(Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data")), providers={"local": local})
    try:
        req = EstimateRequest(model="model", dataset="data.jsonl", method="lora", seq_len=64, batch_size=1)
        job = eng.create_job(
            req,
            user="alice",
            estimate=make_estimate([local.offer()], hours=0.01),
            spec_overrides={"max_steps": 3, "report": {"every_seconds": 0.5}},
        )
        assert job.state == "running", job.message
        from store.models import Job

        with eng.session() as s:
            plan = s.get(Job, job.job_id).plan
        assert plan["base_model"] == str(here / "model") and plan["dataset"]["uri"] == str(
            here / "data.jsonl"
        )
        deadline = time.time() + 600
        while time.time() < deadline and eng.get_job(job.job_id).state not in ("succeeded", "failed"):
            eng.tick()
            time.sleep(1.0)
        view = eng.get_job(job.job_id)
        log = "".join(p.read_text() for p in (tmp_path / "local" / "instances").glob("*/runner.log"))
        assert view.state == "succeeded", f"{view.state}: {view.message}\n{log[-3000:]}"
        assert "shadowed" not in log and view.step == 3
    finally:
        for inst in local.list_instances():
            local.terminate(inst.instance_id)
        eng.close()
