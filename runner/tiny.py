"""`tunebot-runner make-tiny DIR`: a tiny Llama, a locally trained tokenizer, a dataset and a ready job.

Tests, the demo and the local provider need a model that trains in seconds on a laptop CPU without
downloading anything. Everything here is made from a seed, so the same seed writes byte-identical
files (the model from a LlamaConfig and a seeded init, the tokenizer trained on the generated text).

Layout written under DIR:
  model/        LlamaForCausalLM (hidden 64, 2 layers, 4 heads, 2 kv heads) + tokenizer files
  data.jsonl    alpaca-style records with skewed lengths and a learnable structure
  job.json      a JobSpec: checkpoints in DIR/checkpoints, output in DIR/output, CPU (gpus 0)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from runner.contract.spec import JobSpec

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
# `{% generation %}` marks assistant text, so `apply_chat_template(return_assistant_tokens_mask=True)`
# can tell which tokens carry the loss.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|assistant|>\n{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}\n"
    "{% else %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = ["red", "blue", "green", "cat", "dog", "bird", "sun", "moon", "tree", "rock", "fish", "star"]
# The alpaca prompt wording goes into the tokenizer corpus so that prompts cost few tokens at seq_len 256.
_PROMPT_TEXT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n\n### Input:\n"
    "\n### Response:\n"
)
_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _records(rng: random.Random, n: int) -> list[dict[str, str]]:
    """Synthetic tasks a 2-layer model learns fast; lengths are skewed (most short, a few long)."""
    records: list[dict[str, str]] = []
    for _ in range(n):
        kind = rng.choice(["repeat", "count", "reverse", "spell"])
        length = min(1 + int(rng.expovariate(1 / 4)), 40)  # skewed: median ~3, tail to 40
        if kind == "repeat":
            words = [rng.choice(_WORDS) for _ in range(length)]
            records.append(
                {"instruction": "Repeat the words.", "input": " ".join(words), "output": " ".join(words)}
            )
        elif kind == "count":
            records.append(
                {
                    "instruction": f"Count from one to {length}.",
                    "input": "",
                    "output": " ".join(str(i) for i in range(1, length + 1)),
                }
            )
        elif kind == "reverse":
            words = [rng.choice(_WORDS) for _ in range(length)]
            records.append(
                {
                    "instruction": "Reverse the words.",
                    "input": " ".join(words),
                    "output": " ".join(reversed(words)),
                }
            )
        else:
            digits = [rng.randrange(10) for _ in range(length)]
            records.append(
                {
                    "instruction": "Spell the digits.",
                    "input": "".join(map(str, digits)),
                    "output": " ".join(_NUMBERS[d] for d in digits),
                }
            )
    return records


def _train_tokenizer(texts: list[str], out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", model_max_length=4096
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def _make_model(seed: int, vocab_size: int, out_dir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        # Wider than the usual 0.02 so that a random base has logits with some range:
        # LoRA on a 0.02-init 64-wide model barely moves the loss.
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out_dir))


def tiny_job(out_dir: Path, *, seed: int = 0, method: str = "lora") -> JobSpec:
    """The job make_tiny writes; settings chosen so the loss clearly drops in ~10-30 s on 2 CPU cores."""
    out_dir = out_dir.resolve()
    learning_rate = {"full": 3e-3, "lora": 1e-2, "qlora": 1e-2}[method]
    return JobSpec.model_validate(
        {
            "job_id": f"tiny-{method}-{seed}",
            "base_model": str(out_dir / "model"),
            "dataset": {"uri": str(out_dir / "data.jsonl"), "format": "alpaca"},
            "method": method,
            "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"},
            "seq_len": 256,
            "micro_batch_size": 4,
            "grad_accum": 2,
            "epochs": 1.0,
            "max_steps": 60,
            "learning_rate": learning_rate,
            "lr_scheduler": "cosine",
            "warmup_ratio": 0.05,
            "optimizer": "adamw",
            "packing": True,
            "gradient_checkpointing": False,
            "attn": "sdpa",
            "gpus": 0,
            "checkpoint": {"uri": str(out_dir / "checkpoints"), "every_minutes": 0.1, "keep": 2},
            "plateau": {"enabled": False},
            "seed": seed,
            "output_uri": str(out_dir / "output"),
        }
    )


def make_tiny(out_dir: Path, *, seed: int = 0, method: str = "lora") -> Path:
    """Write a tiny model, tokenizer, dataset and job.json under `out_dir`; return the job.json path."""
    if method not in ("lora", "qlora", "full"):
        raise ValueError(f"method must be lora, qlora or full, not {method!r}")
    out_dir = Path(out_dir)
    model_dir = out_dir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    records = _records(rng, 400)
    texts = [_PROMPT_TEXT + " ".join(r.values()) for r in records]
    _train_tokenizer(texts, model_dir)
    _make_model(seed, VOCAB_SIZE, model_dir)
    with (out_dir / "data.jsonl").open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
    job = tiny_job(out_dir, seed=seed, method=method)
    job_path = out_dir / "job.json"
    job_path.write_text(job.model_dump_json(indent=2, exclude_none=True) + "\n", encoding="utf-8")
    return job_path
