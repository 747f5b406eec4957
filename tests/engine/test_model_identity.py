"""The model asked for is the model trained: a variant (-Instruct, -chat, -it) shares its base's config in the
planner's table but keeps its own id from the request to the spec, the runner and the output."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes.hub import FakeHub
from fakes.snapshot_plan import snapshot_plan

from bot.engine.launching.jobspec import spec_fields
from bot.planner.request import EstimateRequest
from bot.settings import Settings

INSTRUCT = "meta-llama/Llama-3.2-1B-Instruct"  # in the built-in table as a variant of meta-llama/Llama-3.2-1B


@pytest.mark.parametrize(
    ("typed", "trained"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("meta-llama/llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),  # the id's own spelling
        ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("google/gemma-2-9b-it", "google/gemma-2-9b-it"),
        ("meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-chat-hf"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        ("acme/Llama-3.1-8B-Instruct", "acme/Llama-3.1-8B-Instruct"),  # a fine-tune: shares the config only
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),  # a short alias names the base
    ],
)
def test_the_requested_id_goes_from_request_to_card_to_spec(typed: str, trained: str) -> None:
    est = snapshot_plan(EstimateRequest(model=typed, tokens=1_000_000))
    assert est.model.name == trained  # the card's name
    assert est.training is not None and est.training.base_model == trained
    fields = spec_fields(est.training)
    assert fields["base_model"] == trained and fields["base_model_name"] == trained


def test_a_shared_config_is_said_not_hidden() -> None:
    est = snapshot_plan(EstimateRequest(model="google/gemma-2-9b-it", tokens=1_000_000))
    assert "config shared with google/gemma-2-9b" in est.assumptions[0]
    base = snapshot_plan(EstimateRequest(model="google/gemma-2-9b", tokens=1_000_000))
    assert est.model.parameters == base.model.parameters


@pytest.mark.slow
def test_launching_an_instruct_model_trains_that_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-Instruct` through the real planner, engine and local provider: the runner downloads and trains the
    Instruct repo (a tiny model published under that id on a fake Hub), never the base."""
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    with FakeHub(token="hf_identity_token") as hub:
        hub.add_folder(INSTRUCT, tiny / "model")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # the runner's download cache
        for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # this runner downloads (from loopback)
            monkeypatch.delenv(offline, raising=False)
        local = LocalProvider(workdir=tmp_path / "local", price_per_hour=1.0)
        settings = Settings(
            TUNEBOT_DATA_DIR=str(tmp_path / "data"),
            TUNEBOT_HF_READ_TOKEN="hf_identity_token",  # what the host downloads with (issue 28)
            HF_ENDPOINT=hub.url,
            TUNEBOT_LOCAL_MAX_HOURS=100.0,
        )
        eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'id.db'}", providers={"local": local})
        req = EstimateRequest(
            model=INSTRUCT,
            dataset=str(tiny / "data.jsonl"),
            method="lora",
            lora_r=8,
            seq_len=256,
            batch_size=4,
            gradient_checkpointing=False,
            max_steps=3,
            plateau=False,
            gpus=1,
        )
        est = eng.estimate(req)
        assert est.training is not None and est.training.base_model == INSTRUCT
        job = eng.create_job(
            req, user="alice", estimate=est, max_cost=10.0, spec_overrides={"report": {"every_seconds": 0.2}}
        )
        deadline = time.time() + 240
        while time.time() < deadline:
            eng.tick()
            view = eng.get_job(job.job_id)
            if view.state in ("succeeded", "stopped", "failed"):
                break
            time.sleep(0.3)
        assert view.state == "succeeded", f"{view.state}: {view.message}"
        downloaded = {path for method, path, status in hub.requests if "/resolve/" in path and status == 200}
        weights = [p for p in downloaded if p.endswith("model.safetensors")]
        assert weights and all(p.startswith(f"/{INSTRUCT}/resolve/") for p in weights)
        assert not any(p.startswith("/meta-llama/Llama-3.2-1B/") for p in downloaded)
        output = Path(view.output_uri or "")
        spec = json.loads((output / "job.json").read_text())
        assert spec["base_model"] == INSTRUCT and spec["base_model_name"] == INSTRUCT
        adapter = json.loads((output / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == INSTRUCT
        eng.close()
