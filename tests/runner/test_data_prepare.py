"""prepare(): formats parse, malformed records name their line, loss masks are where users expect them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import fsspec
import pytest

from runner.contract.spec import CheckpointSpec, DatasetSpec, JobSpec
from runner.data import IGNORE_INDEX, DatasetError, prepare


def make_spec(
    uri: str | Path,
    fmt: str = "alpaca",
    *,
    seq_len: int = 256,
    overlong: str = "truncate",
    eval_fraction: float = 0.0,
    seed: int = 0,
) -> JobSpec:
    return JobSpec(
        job_id="t1",
        base_model="tiny",
        seq_len=seq_len,
        seed=seed,
        dataset=DatasetSpec(uri=str(uri), format=fmt, overlong=overlong, eval_fraction=eval_fraction),
        checkpoint=CheckpointSpec(uri="/tmp/unused"),
        output_uri="/tmp/unused",
    )


def trained_text(tokenizer: Any, example: Any) -> str:
    return tokenizer.decode(
        [t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE_INDEX]
    )


def ignored_text(tokenizer: Any, example: Any) -> str:
    return tokenizer.decode(
        [t for t, label in zip(example.input_ids, example.labels, strict=True) if label == IGNORE_INDEX]
    )


def test_alpaca_loss_is_on_the_response_only(write_jsonl, data_tokenizer):
    path = write_jsonl(
        [
            {"instruction": "What is two plus two?", "input": "", "output": "Four."},
            {"instruction": "Translate to French.", "input": "Hello world", "output": "Bonjour."},
        ]
    )
    data = prepare(make_spec(path), data_tokenizer)
    assert [e.source_line for e in data.train] == [1, 2]
    first, second = data.train
    assert trained_text(data_tokenizer, first) == "Four.</s>"
    assert "What is two plus two?" in ignored_text(data_tokenizer, first)
    assert "### Response:" in ignored_text(data_tokenizer, first)
    assert "Hello world" in ignored_text(data_tokenizer, second)  # the input is prompt, not target
    assert trained_text(data_tokenizer, second) == "Bonjour.</s>"
    # BOS first, EOS last, and every response token is labelled with itself.
    assert first.input_ids[0] == data_tokenizer.bos_token_id
    assert first.input_ids[-1] == data_tokenizer.eos_token_id
    n_prompt = first.labels.index(next(label for label in first.labels if label != IGNORE_INDEX))
    assert first.labels[n_prompt:] == first.input_ids[n_prompt:]
    assert set(first.labels[:n_prompt]) == {IGNORE_INDEX}


def test_messages_loss_is_on_assistant_turns_only(write_jsonl, data_tokenizer):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "The capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    path = write_jsonl([{"messages": conversation}])
    (example,) = prepare(make_spec(path, "messages"), data_tokenizer).train
    trained = trained_text(data_tokenizer, example)
    assert trained == "Four.<|end|>\nParis.<|end|>\n</s>"
    ignored = ignored_text(data_tokenizer, example)
    for text in ("Be brief.", "What is two plus two?", "The capital of France?", "<|system|>", "<|user|>"):
        assert text in ignored
        assert text not in trained
    assert "<|assistant|>" not in trained  # the header is prompt; the model only learns the reply
    rendered = data_tokenizer.apply_chat_template(conversation, tokenize=False)
    assert data_tokenizer.decode(example.input_ids) == rendered + "</s>"


def test_messages_with_generation_markers_uses_the_template_mask(write_jsonl, data_tokenizer, monkeypatch):
    # A template that rewrites earlier turns (not prefix-stable) but marks generations: the fallback path.
    template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|>\n{% generation %}"
        "{{ m['content'] if loop.last else m['content'] | upper }}<|end|>\n{% endgeneration %}"
        "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    monkeypatch.setattr(data_tokenizer, "chat_template", template)
    conversation = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "world"},
        {"role": "user", "content": "fox"},
        {"role": "assistant", "content": "dog"},
    ]
    (example,) = prepare(
        make_spec(write_jsonl([{"messages": conversation}]), "messages"), data_tokenizer
    ).train
    assert trained_text(data_tokenizer, example) == "WORLD<|end|>\ndog<|end|>\n</s>"
    assert "Hello" in ignored_text(data_tokenizer, example)


def test_prompt_completion_loss_is_on_the_completion_only(write_jsonl, data_tokenizer):
    path = write_jsonl([{"prompt": "The capital of France is", "completion": " Paris."}])
    (example,) = prepare(make_spec(path, "prompt_completion"), data_tokenizer).train
    assert trained_text(data_tokenizer, example) == " Paris.</s>"
    assert ignored_text(data_tokenizer, example) == "<s>The capital of France is"


def test_text_trains_on_everything_but_the_first_token(write_jsonl, data_tokenizer):
    (example,) = prepare(
        make_spec(write_jsonl([{"text": "The quick brown fox."}]), "text"), data_tokenizer
    ).train
    assert example.labels[0] == IGNORE_INDEX  # never predicted by a causal LM
    assert example.labels[1:] == example.input_ids[1:]
    assert data_tokenizer.decode(example.input_ids) == "<s>The quick brown fox.</s>"


@pytest.mark.parametrize(
    ("fmt", "bad_line", "message"),
    [
        ("alpaca", "{not json", "invalid JSON"),
        ("alpaca", json.dumps({"instruction": "x"}), "missing the key 'output'"),
        ("alpaca", json.dumps({"instruction": "x", "output": 3}), "'output' must be a string"),
        ("alpaca", json.dumps(["instruction", "output"]), "expected a JSON object"),
        ("messages", json.dumps({"messages": [{"role": "robot", "content": "hi"}]}), "has an unknown role"),
        ("messages", json.dumps({"messages": [{"role": "user"}]}), "missing the key 'content'"),
        ("messages", json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "no assistant turn"),
        ("messages", json.dumps({"messages": "hello"}), "non-empty list"),
        ("prompt_completion", json.dumps({"prompt": "x"}), "missing the key 'completion'"),
        ("text", json.dumps({"text": None}), "missing the key 'text'"),
    ],
)
def test_malformed_record_names_file_and_line(write_jsonl, data_tokenizer, fmt, bad_line, message):
    good = {
        "alpaca": {"instruction": "a", "output": "b"},
        "messages": {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        "prompt_completion": {"prompt": "a", "completion": "b"},
        "text": {"text": "a b c"},
    }[fmt]
    path = write_jsonl([good, "", good, bad_line, good])  # blank line 2 still counts for numbering
    with pytest.raises(DatasetError) as info:
        prepare(make_spec(path, fmt), data_tokenizer)
    assert f"{path}:4:" in str(info.value)
    assert message in str(info.value)
    assert info.value.line == 4


def test_empty_dataset_is_a_clear_error(write_jsonl, data_tokenizer):
    path = write_jsonl(["", "   "])
    with pytest.raises(DatasetError, match="dataset is empty"):
        prepare(make_spec(path), data_tokenizer)


def test_missing_dataset_is_a_clear_error(tmp_path, data_tokenizer):
    with pytest.raises(DatasetError, match="not found"):
        prepare(make_spec(tmp_path / "nope.jsonl"), data_tokenizer)


def test_overlong_records_are_truncated_and_counted(write_jsonl, data_tokenizer):
    long = {"text": "The quick brown fox jumps over the lazy dog. " * 20}
    path = write_jsonl([long, {"text": "Hello world."}, long])
    data = prepare(make_spec(path, "text", seq_len=32), data_tokenizer)
    assert data.stats.as_dict()["truncated"] == 2
    assert data.stats.dropped == 0 and data.stats.records == 3 and data.stats.examples == 3
    assert max(len(e) for e in data.train) == 32
    assert data.stats.tokens == sum(len(e) for e in data.train)


def test_overlong_records_are_dropped_and_counted(write_jsonl, data_tokenizer):
    long = {"text": "The quick brown fox jumps over the lazy dog. " * 20}
    path = write_jsonl([long, {"text": "Hello world."}, long])
    data = prepare(make_spec(path, "text", seq_len=32, overlong="drop"), data_tokenizer)
    assert (data.stats.dropped, data.stats.truncated, data.stats.examples) == (2, 0, 1)
    assert [e.source_line for e in data.train] == [2]


def test_all_dropped_is_a_clear_error(write_jsonl, data_tokenizer):
    path = write_jsonl([{"text": "The quick brown fox jumps over the lazy dog. " * 20}])
    with pytest.raises(DatasetError, match="all 1 were dropped"):
        prepare(make_spec(path, "text", seq_len=16, overlong="drop"), data_tokenizer)


def test_eval_split_is_deterministic_by_seed(write_jsonl, data_tokenizer):
    path = write_jsonl([{"text": f"Hello world {i}."} for i in range(40)])
    a = prepare(make_spec(path, "text", eval_fraction=0.1, seed=1), data_tokenizer)
    b = prepare(make_spec(path, "text", eval_fraction=0.1, seed=1), data_tokenizer)
    c = prepare(make_spec(path, "text", eval_fraction=0.1, seed=2), data_tokenizer)
    lines = lambda d: sorted(e.source_line for e in d.eval)  # noqa: E731
    assert len(a.eval) == 4 and len(a.train) == 36
    assert lines(a) == lines(b)
    assert lines(a) != lines(c)
    assert not set(lines(a)) & {e.source_line for e in a.train}


def test_reads_fsspec_uris_and_gzip(data_tokenizer, tmp_path):
    with fsspec.open("memory://bucket/data.jsonl", "wt") as f:
        f.write(json.dumps({"prompt": "Hello", "completion": " world"}) + "\n")
    assert (
        len(prepare(make_spec("memory://bucket/data.jsonl", "prompt_completion"), data_tokenizer).train) == 1
    )
    gz = tmp_path / "data.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps({"text": "Hello world."}) + "\n")
    assert len(prepare(make_spec(f"file://{gz}", "text"), data_tokenizer).train) == 1


def test_messages_with_bos_and_eos_in_the_template(write_jsonl, data_tokenizer, monkeypatch):
    # Llama-3 / runner.tiny style: BOS from the template, EOS closing every turn (users' too).
    template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )
    monkeypatch.setattr(data_tokenizer, "chat_template", template)
    conversation = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "world"}]
    (example,) = prepare(
        make_spec(write_jsonl([{"messages": conversation}]), "messages"), data_tokenizer
    ).train
    assert trained_text(data_tokenizer, example) == "world</s>\n"  # the template's EOS, not a second one
    assert ignored_text(data_tokenizer, example) == "<s><|user|>\nHello</s>\n<|assistant|>\n"
    assert example.input_ids.count(data_tokenizer.bos_token_id) == 1


def test_messages_need_a_chat_template(write_jsonl, data_tokenizer, monkeypatch):
    monkeypatch.setattr(data_tokenizer, "chat_template", None)
    path = write_jsonl(
        [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]
    )
    with pytest.raises(DatasetError, match=r"data.jsonl:1: the tokenizer has no chat template"):
        prepare(make_spec(path, "messages"), data_tokenizer)
