"""What a job leaves says what happened (issue 27): on eac3cff the model card said `from_pretrained("PATH")`,
had no `base_model:`, was titled "lora fine-tune of model" and gave a cost other than the ledger's spend;
job.json said bf16 and FSDP for a run that trained in fp32 on the CPU.

A real tiny job on this machine (the local provider and the real runner), its model folder saved from a Hub
model (config.json's `_name_or_path`, as `save_pretrained` of a downloaded model leaves it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bot.money import money
from bot.planner.request import EstimateRequest
from bot.settings import Settings

from .fakes import make_estimate

pytestmark = pytest.mark.slow


def test_the_card_and_job_json_of_a_cpu_job_say_what_ran_and_what_it_cost(tmp_path: Path) -> None:
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    config_path = tiny / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "_name_or_path": "acme/tiny-llama"}))
    local = LocalProvider(workdir=tmp_path / "local", price_per_hour=50.0)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"local": local})
    req = EstimateRequest(
        model=str(tiny / "model"),
        dataset=str(tiny / "data.jsonl"),
        method="lora",
        lora_r=8,
        seq_len=128,
        eval_split=0.1,  # the card's "eval loss ... -> ... for $X" line: what the loss bought
    )
    job = eng.create_job(
        req,
        user="alice",
        estimate=make_estimate([local.offer()], hours=0.01),
        max_cost=10.0,
        spec_overrides={"max_steps": 3, "plateau": {"enabled": False}, "report": {"every_seconds": 0.2}},
    )
    deadline = time.time() + 240
    while time.time() < deadline and eng.get_job(job.job_id).state not in ("succeeded", "failed", "stopped"):
        eng.tick()
        time.sleep(0.2)
    view = eng.get_job(job.job_id)
    eng.close()
    assert view.state == "succeeded" and view.output_uri, view
    out = Path(view.output_uri)
    card = (out / "README.md").read_text()
    assert card.startswith("---\nbase_model: acme/tiny-llama\n"), card[:200]
    assert f"# {job.job_id}: LoRA fine-tune of acme/tiny-llama (from the folder `model`)" in card
    assert f'AutoPeftModelForCausalLM.from_pretrained("{out}")' in card and '"PATH"' not in card
    cost_line = next(line for line in card.splitlines() if line.startswith("- cost: "))
    billed = view.spend
    assert billed and cost_line.startswith(f"- cost: {money(billed)} as billed"), cost_line
    # One job, one cost (issue 38): the eval line's "for $X" is the billed cost, not the runner's reckoning
    eval_line = next(line for line in card.splitlines() if "(base model) ->" in line)
    assert eval_line.endswith(f") for {money(billed)}"), (eval_line, money(billed))
    assert "| trained on | cpu, 1 process(es), fp32, sharding none |" in card
    # the attention and kernels that ran, not only those asked for (on a GPU: the varlen kernel that passed
    # its check on the device, or Liger's; here the CPU's)
    assert "| attention | sdpa |" in card, card
    assert "| kernels | torch (no CUDA device (Liger's kernels are Triton kernels for GPUs)) |" in card, card
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["cost"] == pytest.approx(billed, abs=1e-6) and summary["cost_source"] == "ledger"
    ran = json.loads((out / "job.json").read_text())
    assert ran["precision"] == "fp32" and ran["sharding"] == "none", {
        k: ran[k] for k in ("precision", "sharding")
    }
    assert ran["ran"]["device"] == "cpu" and ran["ran"]["processes"] == 1
    assert ran["ran"]["attention"] == "sdpa" and ran["ran"]["kernels"].startswith("torch (no CUDA device")
    assert ran["ran"]["asked"]["precision"] in ("bf16", None) and ran["ran"]["asked"]["gpus"] == 0
