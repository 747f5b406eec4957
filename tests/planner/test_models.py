"""Resolving what a person types: aliases, config files and folders, the hub (fake, on loopback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.planner.errors import PlanningError, UnknownModelError
from bot.planner.models import resolve

from .conftest import FakeHub

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
TINY_PARAMS = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 2 * 1000 * 64 + 64


@pytest.mark.parametrize(
    ("name", "model_id"),
    [
        ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("META-LLAMA/llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("  llama3.1-8b ", "meta-llama/Llama-3.1-8B"),
        # variants share the base's config and keep their own id
        ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
        ("unsloth/Llama-3.1-8B-Instruct", "unsloth/Llama-3.1-8B-Instruct"),
    ],
)
def test_names_resolve_case_insensitively_with_aliases(name: str, model_id: str) -> None:
    arch, source = resolve(name)
    assert arch.name == model_id and source == "built-in table"
    assert arch.parameters == resolve("meta-llama/Llama-3.1-8B")[0].parameters


def test_a_short_name_known_only_without_its_suffix_asks_for_the_hub_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``qwen2.5-7b-chat`` names no repo: training Qwen/Qwen2.5-7B instead would be a silent swap."""
    monkeypatch.setenv("TUNEBOT_HF_OFFLINE", "1")
    with pytest.raises(UnknownModelError) as info:
        resolve("qwen2.5-7b-chat")
    assert "Qwen/Qwen2.5-7B-Instruct" in info.value.suggestions


def test_config_file_and_model_folder(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    for target in (folder, folder / "config.json"):
        arch, source = resolve(str(target))
        assert source == "config file" and arch.parameters == TINY_PARAMS


def test_missing_or_broken_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PlanningError, match="does not exist"):
        resolve(str(tmp_path / "nope" / "config.json"))
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(PlanningError, match="cannot read"):
        resolve(str(bad))


def test_unknown_model_lists_closest_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBOT_HF_OFFLINE", "1")
    with pytest.raises(UnknownModelError) as info:
        resolve("llama-3.1-8x")
    assert "meta-llama/Llama-3.1-8B" in info.value.suggestions
    assert "Closest known" in str(info.value)


def test_hub_config_is_fetched_with_token_and_cached(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.configs["acme/tiny-llama"] = TINY
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    arch, source = resolve("acme/tiny-llama")
    assert (arch.parameters, source) == (TINY_PARAMS, "hub")
    assert fake_hub.requests == [("/acme/tiny-llama/resolve/main/config.json", "Bearer hf_secret")]
    arch, source = resolve("acme/tiny-llama")  # second time: from the disk cache, no request
    assert source == "hub cache" and len(fake_hub.requests) == 1


def test_hub_miss_falls_back_to_suggestions(fake_hub: FakeHub) -> None:
    with pytest.raises(UnknownModelError, match="could not be fetched") as info:
        resolve("meta-llama/Llama-3.1-8B-Experimental")
    assert "meta-llama/Llama-3.1-8B" in info.value.suggestions


def test_unreachable_hub_falls_back_to_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBOT_HF_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("TUNEBOT_HF_OFFLINE", raising=False)
    assert resolve("Qwen/Qwen2.5-7B-Instruct")[1] == "built-in table"
    with pytest.raises(UnknownModelError):
        resolve("acme/not-in-table")


@pytest.mark.parametrize("declare", [True, False], ids=["content-length", "no-content-length"])
def test_a_huge_hub_config_is_refused_without_reading_or_caching_it(fake_hub: FakeHub, declare: bool) -> None:
    from bot.planner.models import MAX_CONFIG_BYTES, _cache_dir

    fake_hub.huge["acme/huge"] = (300 << 20, declare)  # 300 MB of JSON whitespace, then {}
    with pytest.raises(PlanningError, match="larger than 2 MiB, which no model config is"):
        resolve("acme/huge")
    # the rest was never taken (before: all 300 MB, held)
    assert fake_hub.sent_before_hang_up("acme/huge") < 32 << 20
    assert not (_cache_dir() / "acme--huge.json").exists()
    assert MAX_CONFIG_BYTES == 2 << 20


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden_size", 10**12),
        ("num_hidden_layers", -1),
        ("vocab_size", 1.5),
        ("num_attention_heads", True),
        ("intermediate_size", "4096"),
        ("num_local_experts", 10**9),
    ],
)
def test_hub_config_dimensions_are_validated_and_bad_ones_never_cached(
    fake_hub: FakeHub, key: str, value: object
) -> None:
    from bot.planner.models import _cache_dir

    fake_hub.configs["acme/odd"] = {**TINY, key: value}
    with pytest.raises(PlanningError, match=f"config.json has {key}=.*outside"):
        resolve("acme/odd")
    assert not (_cache_dir() / "acme--odd.json").exists()
    # a cache file planted by an older version is checked the same way and fetched again
    cache = _cache_dir() / "acme--odd.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({**TINY, key: value}))
    fake_hub.configs["acme/odd"] = TINY
    assert resolve("acme/odd")[1] == "hub"
