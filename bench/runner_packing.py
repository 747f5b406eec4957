"""Packing vs padding: non-pad tokens per second training the tiny model on skewed lengths, from one run.

Usage: .venv/bin/python bench/runner_packing.py [--steps 30] [--micro-batch 8] [--seq-len 256]

Builds the tiny model with runner.tiny.make_tiny (nothing downloaded), writes a text dataset where most
records are short and a few are long, and runs the same number of optimizer steps twice with the same
seq_len and micro-batch: once padding each micro-batch to its longest example, once packing examples
into full rows (runner.data.make_batches, block-diagonal masks). The model is loaded the way the runner
loads it (runner.model.load_model: LoRA, sdpa). The two runs alternate step by step; only
steps after 2 warm-up steps are timed.
Target: packed/padded >= 1.5x.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.contract.spec import DatasetSpec, JobSpec  # noqa: E402
from runner.data import make_batches, prepare  # noqa: E402
from runner.model import load_model, load_tokenizer  # noqa: E402
from runner.tiny import make_tiny  # noqa: E402

WARMUP_STEPS = 2
WORDS = ["red", "blue", "green", "cat", "dog", "bird", "sun", "moon", "tree", "rock", "fish", "star"]


def skewed_dataset(path: Path, *, n: int, seed: int) -> None:
    """90% short records (4-24 words), 10% long ones (120-200 words)."""
    import json

    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(n):
            words = rng.randint(120, 200) if rng.random() < 0.1 else rng.randint(4, 24)
            handle.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(words))}) + "\n")


class Run:
    """One configuration (padded or packed): its own model copy, optimizer and batch stream."""

    def __init__(self, spec: JobSpec, tokenizer, examples, *, packing: bool) -> None:
        torch.manual_seed(spec.seed)
        self.spec, self.examples, self.packing = spec, examples, packing
        self.pad_id = tokenizer.pad_token_id or 0
        self.model = load_model(spec, Path(spec.base_model), torch.device("cpu"))
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=spec.learning_rate
        )
        self.batches, self.epoch, self.index = None, 0, 0
        self.tokens = self.slots = 0
        self.elapsed, self.loss = 0.0, float("nan")

    def step(self, *, timed: bool) -> None:
        spec = self.spec
        if self.batches is None or self.index >= len(self.batches):
            self.batches = make_batches(
                self.examples,
                seq_len=spec.seq_len,
                micro_batch_size=spec.micro_batch_size,
                packing=self.packing,
                attn="sdpa",
                seed=spec.seed,
                epoch=self.epoch,
                pad_id=self.pad_id,
            )
            self.epoch, self.index = self.epoch + 1, 0
        batch = self.batches[self.index]
        self.index += 1
        start = time.perf_counter()
        inputs = dict(batch)
        labels = inputs.pop("labels")
        logits = self.model(**inputs, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss = float(loss.detach())
        if timed:
            self.elapsed += time.perf_counter() - start
            self.tokens += batch.num_tokens
            self.slots += batch["input_ids"].numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--examples", type=int, default=600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        job = JobSpec.model_validate_json(make_tiny(root / "tiny").read_text())
        skewed_dataset(root / "skewed.jsonl", n=args.examples, seed=0)
        spec = job.model_copy(
            update={
                "dataset": DatasetSpec(uri=str(root / "skewed.jsonl"), format="text"),
                "seq_len": args.seq_len,
                "micro_batch_size": args.micro_batch,
                "grad_accum": 1,
            }
        )
        tokenizer = load_tokenizer(Path(spec.base_model))
        data = prepare(spec, tokenizer)
        lengths = sorted(len(e) for e in data.train)
        print(
            f"dataset: {len(lengths)} examples, median {lengths[len(lengths) // 2]} tokens, "
            f"p95 {lengths[int(len(lengths) * 0.95)]}, max {lengths[-1]}; seq_len {spec.seq_len}, "
            f"micro-batch {spec.micro_batch_size}, {args.steps} timed optimizer steps each, "
            f"{torch.get_num_threads()} threads"
        )
        runs = {
            name: Run(spec, tokenizer, data.train, packing=name == "packed") for name in ("padded", "packed")
        }
        # Alternate the two configurations step by step so that warm-up and other load on the machine
        # hit both alike; only steps after the warm-up are timed.
        for step in range(WARMUP_STEPS + args.steps):
            for run in runs.values():
                run.step(timed=step >= WARMUP_STEPS)
        rates = {}
        for name, run in runs.items():
            rates[name] = run.tokens / run.elapsed
            print(
                f"{name:>7}: {rates[name]:10,.0f} non-pad tokens/s  ({run.tokens:,} tokens in "
                f"{run.slots:,} slots, {100 * (1 - run.tokens / run.slots):4.1f}% padding, "
                f"{run.elapsed:.1f} s, last loss {run.loss:.3f})"
            )
        ratio = rates["packed"] / rates["padded"]
        print(
            f"packing speed-up: {ratio:.2f}x non-pad tokens/s (target >= 1.5x): "
            f"{'PASS' if ratio >= 1.5 else 'FAIL'}"
        )


if __name__ == "__main__":
    main()
