"""The length rules the planner and the runner share: fitting a tokenized record to seq_len (the overlong
policy), the counts that come of it, and the seeded train/eval split. Pure Python: the planner counts with
them what the runner will train (runner/data/prepare.py trains with the same functions)."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import TypeVar

from runner.contract.example import IGNORE_INDEX, Example
from runner.contract.spec import Defaults

T = TypeVar("T")


@dataclass
class DataStats:
    """What happened to the records; truncated and dropped go into the RunSummary."""

    records: int = 0  # non-blank lines read
    truncated: int = 0  # longer than seq_len, cut to seq_len
    dropped: int = 0  # longer than seq_len with overlong="drop", or nothing left to train on
    tokens: int = 0  # tokens in the kept examples (train + eval)
    examples: int = 0  # kept examples (train + eval)
    train_examples: int = 0
    eval_examples: int = 0
    trainable_tokens: int = 0  # tokens that carry loss

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def fit_example(
    ids: list[int], labels: list[int], line: int, *, seq_len: int, overlong: str, stats: DataStats
) -> Example | None:
    """Apply the overlong policy; also drop records left with nothing to learn (counted as dropped)."""
    if len(ids) > seq_len:
        if overlong == "drop":
            stats.dropped += 1
            return None
        ids, labels = ids[:seq_len], labels[:seq_len]
        stats.truncated += 1
    # The first token is never predicted by a causal LM; ignoring it keeps packed rows from learning
    # "previous example's last token -> this example's first token".
    labels = [IGNORE_INDEX, *labels[1:]]
    example = Example(input_ids=ids, labels=labels, source_line=line)
    if example.trainable_tokens == 0:
        stats.dropped += 1
        return None
    return example


def eval_size(examples: int, eval_fraction: float | None) -> int:
    """How many of ``examples`` are held out: ``eval_fraction`` of them (at least one, at least one left to
    train); None is the automatic split (runner.contract.spec.Defaults: 5% of 1,000 examples or more, at most
    200)."""
    if examples < 2:
        return 0
    if eval_fraction is None:
        if examples < Defaults.auto_eval_min_examples:
            return 0
        return min(Defaults.auto_eval_max_examples, math.ceil(examples * Defaults.auto_eval_fraction))
    if eval_fraction <= 0:
        return 0
    return min(examples - 1, max(1, math.ceil(examples * eval_fraction)))


def split(examples: list[T], eval_fraction: float | None, *, seed: int) -> tuple[list[T], list[T]]:
    """Deterministic train/eval split; at least one example stays in train. It depends only on the number of
    examples and the seed, so the planner splits token lengths exactly as the runner splits examples."""
    n_eval = eval_size(len(examples), eval_fraction)
    if n_eval == 0:
        return list(examples), []
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    eval_ids = set(order[:n_eval])
    train = [e for i, e in enumerate(examples) if i not in eval_ids]
    evaluation = [e for i, e in enumerate(examples) if i in eval_ids]
    return train, evaluation
