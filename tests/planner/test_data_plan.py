"""The planner counts a dataset with the model's own tokenizer: from its folder, or its files on the Hub (a
fake one on loopback), cached; past MAX_EXACT_RECORDS a sample is tokenized, the rest scaled by size."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.hub import FakeHub
from fakes.snapshot_plan import snapshot_plan

from bot.planner import data_plan
from bot.planner.errors import BadRequestError
from bot.planner.request import EstimateRequest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.tiny import make_tiny

    out = tmp_path_factory.mktemp("tiny-data-plan")
    make_tiny(out)
    return out


def _request(model: str, tiny: Path, **extra: object) -> EstimateRequest:
    return EstimateRequest(model=model, dataset=str(tiny / "data.jsonl"), seq_len=256, gpu="cpu", **extra)


def test_the_tokenizer_of_a_hub_model_is_fetched_once_and_counts_like_the_local_one(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = snapshot_plan(_request(str(tiny / "model"), tiny))
    with FakeHub(token="hf_tok_counts") as hub:
        hub.add_folder("acme/Tiny-Instruct", tiny / "model")
        monkeypatch.setenv("TUNEBOT_HF_URL", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_tok_counts")
        monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.delenv("TUNEBOT_HF_OFFLINE", raising=False)
        from bot.settings import get_settings

        get_settings.cache_clear()
        try:
            remote = snapshot_plan(_request("acme/Tiny-Instruct", tiny))
            fetched = [p for _, p, _ in hub.requests if "tokenizer" in p]
            again = snapshot_plan(_request("acme/Tiny-Instruct", tiny))
        finally:
            get_settings.cache_clear()
        assert any(p.endswith("/tokenizer.json") for p in fetched)
        assert [p for _, p, _ in hub.requests if "tokenizer" in p] == fetched  # then from the cache
    assert remote.time.token_source == local.time.token_source == "runner's tokenizer, template and packing"
    assert (remote.time.tokens, remote.time.steps) == (local.time.tokens, local.time.steps)
    assert again.time.tokens == local.time.tokens


def test_without_the_tokenizer_the_estimate_says_it_approximates(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEBOT_HF_OFFLINE", "1")
    est = snapshot_plan(_request("meta-llama/Llama-3.2-1B-Instruct", tiny))
    assert est.time.token_source == "chars/4 approximation" and est.time.steps_per_epoch is None


def test_a_large_dataset_is_sampled_and_scaled_by_characters(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = snapshot_plan(_request(str(tiny / "model"), tiny))
    monkeypatch.setattr(data_plan, "MAX_EXACT_RECORDS", 80)
    sampled = snapshot_plan(_request(str(tiny / "model"), tiny))
    assert sampled.time.token_source.startswith("runner's tokenizer on 80 of 400 records")
    assert sampled.time.tokens == pytest.approx(exact.time.tokens, rel=0.05)


def test_a_dataset_beyond_what_an_estimate_reads_is_approximated_from_a_sample(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner-exact count holds every record in memory: only up to TUNEBOT_DATASET_SAMPLE_MB; past it
    the estimate samples (bounded) and says so. A record over the line cap is refused either way."""
    from bot.settings import get_settings

    exact = snapshot_plan(_request(str(tiny / "model"), tiny))
    size = (tiny / "data.jsonl").stat().st_size
    monkeypatch.setenv("TUNEBOT_DATASET_SAMPLE_MB", str(size / 4 / 2**20))
    monkeypatch.setenv("TUNEBOT_DATASET_MAX_LINE_MB", str(4096 / 2**20))
    get_settings.cache_clear()
    try:
        sampled = snapshot_plan(_request(str(tiny / "model"), tiny))
        long = tmp_path / "long.jsonl"
        long.write_text(
            (tiny / "data.jsonl").read_text().splitlines()[0] + "\n" + '{"text": "' + "x" * 5000 + '"}\n'
        )
        with pytest.raises(BadRequestError, match="long.jsonl:2: a line is longer than 4,096 bytes"):
            snapshot_plan(
                EstimateRequest(model=str(tiny / "model"), dataset=str(long), seq_len=256, gpu="cpu")
            )
    finally:
        get_settings.cache_clear()
    assert "scaled up" in sampled.time.token_source and "of the file" in sampled.time.token_source
    assert sampled.time.tokens == pytest.approx(exact.time.tokens, rel=0.35)  # chars/4 against the tokenizer
