"""`tunebot estimate` and `tunebot gpus`: output, the JSON contract, exit codes, import lightness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No cloud key and the local provider off: nothing here can launch, so the planner labels among every
    fitting offer of the snapshot (with the local provider on, the labels go to what `launch` would rent)."""
    from bot.settings import get_settings

    monkeypatch.setenv("TUNEBOT_LOCAL_PROVIDER", "0")
    get_settings.cache_clear()


def test_json_contract_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    no_engine(monkeypatch)
    result = run("estimate", "meta-llama/Llama-3.1-8B", "--tokens", "1000000", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"]["parameters"] == 8_030_261_248
    assert data["memory"]["per_gpu_gb"] > 0
    assert {
        "weights",
        "adapters",
        "gradients",
        "optimizer",
        "activations",
        "logits",
        "cuda_context",
        "allocator",
    } <= set(data["memory"]["breakdown_gb"])
    assert data["speed"]["tokens_per_second"] > 0 and data["speed"]["step_seconds"] > 0
    assert data["time"]["hours"] > 0
    offer = data["offers"][0]
    for key in (
        "provider",
        "gpu",
        "gpu_count",
        "interruptible",
        "price_per_hour",
        "hours",
        "total_cost",
        "fits",
        "reason",
    ):
        assert key in offer
    assert offer["fits"] and "cheapest" in offer["labels"]


def test_lora_count_through_the_cli() -> None:
    result = run(
        "estimate", "llama-3.2-3b", "--lora-r", "32", "--lora-targets", "q,v", "--json", "--tokens", "9"
    )
    assert json.loads(result.output)["model"]["trainable_parameters"] == 9_175_040


def test_human_output_shows_breakdown_offers_and_assumptions(monkeypatch: pytest.MonkeyPatch) -> None:
    no_engine(monkeypatch)
    result = run("estimate", "qwen2.5-7b", "--method", "qlora", "--tokens", "5000000", "--gpu", "rtx-4090")
    assert result.exit_code == 0, result.output
    for text in ("Peak memory per GPU", "weights", "Offers that fit", "cheapest", "Assumptions"):
        assert text in result.output
    assert "another GPU count, GPU type or capacity class" in result.output  # filtered, summarised


def test_nothing_fits_prints_what_would() -> None:
    result = run("estimate", "llama-3.1-70b", "--method", "full", "--gpu", "rtx-4090", "--tokens", "1000")
    assert result.exit_code == 0
    assert "Nothing fits" in result.output and "method=qlora" in result.output


def test_config_file_argument(tmp_path: Path) -> None:
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for arg in (str(tmp_path), str(tmp_path / "config.json")):
        data = json.loads(run("estimate", arg, "--tokens", "1000", "--json").output)
        assert data["model"]["parameters"] == 494_032_768 and data["model"]["source"] == "config file"


def test_gpu_alias_and_capacity_class_filter() -> None:
    data = json.loads(
        run("estimate", "llama-3.1-8b", "--gpu", "a100", "--on-demand", "--tokens", "1000", "--json").output
    )
    fits = [o for o in data["offers"] if o["fits"]]
    assert data["speed"]["gpu"] == "a100-80gb"
    assert fits and all(o["gpu"] == "a100-80gb" and not o["interruptible"] for o in fits)


def test_dataset_tokens_are_counted(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": "x" * 4000}) for _ in range(100)))
    result = run("estimate", "llama-3.2-1b", "--dataset", str(data), "--epochs", "2", "--json")
    t = json.loads(result.output)["time"]
    assert (t["tokens"], t["epochs"], t["token_source"]) == (100 * 1001, 2.0, "chars/4 approximation")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["llama-3.1-8x"], "Closest known: meta-llama/Llama-3.1-8B"),
        (["llama-3.1-8b", "--batch-size", "0"], "--batch-size"),
        (["llama-3.1-8b", "--seq-len", "-5"], "--seq-len"),
        (["llama-3.1-8b", "--gpus", "100000"], "--gpus"),
        (["llama-3.1-8b", "--epochs", "0"], "--epochs"),
        (["llama-3.1-8b", "--lora-r", "100000"], "--lora-r"),
        (["llama-3.1-8b", "--gpu", "tpu-v5"], "unknown GPU"),
        (["llama-3.1-8b", "--optimizer", "sgd"], "--optimizer"),
        (["llama-3.1-8b", "--lora-targets", "attention"], "match no layer"),
        (["llama-3.1-8b", "--tokens", "5", "--dataset", "x.jsonl"], "not both"),
        (["llama-3.1-8b", "--dataset", "/nonexistent/data.jsonl"], "does not exist"),
        (["llama-3.1-8b", "--tokens", "0"], "--tokens"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(args: list[str], message: str) -> None:
    result = run("estimate", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_gpus_catalog_table_and_filter() -> None:
    from bot.providers.registry import CLOUDS

    result = run("gpus", "--gpu", "h100")
    assert result.exit_code == 0
    assert "H100" in result.output and "RTX 4090" not in result.output and "2026-11-20" in result.output
    bad = run("gpus", "--gpu", "voodoo")
    assert bad.exit_code == 2 and "unknown GPU" in bad.output
    data = json.loads(run("gpus", "--json").output)
    assert {o["provider"] for o in data} == set(CLOUDS)


def test_gpus_live_uses_the_providers_catalog() -> None:
    pytest.importorskip("bot.providers.catalog")
    result = run("gpus", "--live", "--gpu", "rtx-4090")
    assert result.exit_code == 0, result.output
    assert "RTX 4090" in result.output and "note:" in result.output  # no keys in tests: snapshot + notes


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["TUNEBOT_HF_OFFLINE"] = "1"
    return env


def test_real_process_exit_codes() -> None:
    exe = [sys.executable, "-m", "bot.cli"]
    ok = subprocess.run(
        [*exe, "estimate", "meta-llama/Llama-3.1-8B", "--tokens", "1000000", "--json"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["model"]["parameters"] == 8_030_261_248
    bad = subprocess.run(
        [*exe, "estimate", "nosuch-model-42b", "--tokens", "5"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown model" in bad.stderr and "Traceback" not in bad.stderr


def test_importing_the_cli_stays_light() -> None:
    code = (
        "import sys, bot.cli; heavy = [m for m in ('torch', 'sqlalchemy', 'slack_bolt', 'matplotlib') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
