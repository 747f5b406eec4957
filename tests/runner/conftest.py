"""Fixtures for the runner tests (each engineer appends; names are prefixed by area)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# --- data pipeline fixtures (runner/data) -----------------------------------------------------------

DATA_SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
DATA_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_DATA_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Below is an instruction that describes a task.",
    "Write a response that appropriately completes the request.",
    "### Instruction:\n### Input:\n### Response:\n",
    "What is two plus two? Four. Hello world. The capital of France is Paris.",
    "system user assistant: be brief, answer the question, translate to French.",
]


@pytest.fixture(scope="session")
def data_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained here (vocab ~400) with BOS/EOS/PAD and a simple chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=DATA_SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_DATA_CORPUS * 10, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   chat_template=DATA_CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def data_tiny_llama(data_tokenizer: Any) -> Callable[[str], Any]:
    """Factory: the same tiny random Llama (seed 0, float32, eval mode) for an attention implementation."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def build(attn: str = "sdpa") -> Any:
        config = LlamaConfig(vocab_size=len(data_tokenizer), hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=512)
        config._attn_implementation = attn
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()

    return build


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    """Write records (dicts, or raw strings for malformed lines) to a jsonl file and return its path."""

    def write(records: list[Any], name: str = "data.jsonl") -> Path:
        path = tmp_path / name
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    return write


# --- training runner fixtures (runner/train, checkpoint, cli) ----------------------------------------


@pytest.fixture(scope="session")
def runner_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One make_tiny folder (model, tokenizer, data.jsonl, job.json) shared by the runner tests."""
    from runner.tiny import make_tiny

    out = tmp_path_factory.mktemp("runner-tiny")
    make_tiny(out, seed=0)
    return out


@pytest.fixture
def runner_job(runner_tiny_dir: Path, tmp_path: Path) -> Callable[..., Any]:
    """Factory: the tiny job with checkpoints and output in this test's tmp_path, plus overrides."""
    from runner.spec import JobSpec

    def build(**overrides: Any) -> JobSpec:
        base = json.loads((runner_tiny_dir / "job.json").read_text())
        base["checkpoint"]["uri"] = str(tmp_path / "checkpoints")
        base["output_uri"] = str(tmp_path / "output")
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        return JobSpec.model_validate(base)

    return build
