"""From a JobSpec's dataset to tokenized train and eval examples, with counts for the run summary."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from runner.data.example import IGNORE_INDEX, Example
from runner.data.tokenize import encode_record
from runner.records import DatasetError, Record, read_records
from runner.spec import Defaults, JobSpec

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


@dataclass
class PreparedData:
    train: list[Example]
    eval: list[Example] = field(default_factory=list)
    stats: DataStats = field(default_factory=DataStats)


def prepare(
    spec: JobSpec, tokenizer: Any, *, records: Iterable[tuple[int, Record]] | None = None
) -> PreparedData:
    """Read, check, tokenize, fit to seq_len and split the dataset of ``spec`` (or the already read
    ``records``, (line, record) pairs from ``runner.records.read_records``).

    The eval split is a seeded shuffle of the kept examples, so a resumed run sees the same split.
    """
    uri = spec.dataset.uri
    return prepare_records(
        read_records(uri, spec.dataset.format) if records is None else records,
        tokenizer,
        seq_len=spec.seq_len,
        overlong=spec.dataset.overlong,
        eval_fraction=spec.dataset.eval_fraction,
        seed=spec.seed,
        uri=uri,
    )


def prepare_records(
    records: Iterable[tuple[int, Record]],
    tokenizer: Any,
    *,
    seq_len: int,
    overlong: str,
    eval_fraction: float | None,
    seed: int,
    uri: str | None = None,
) -> PreparedData:
    """What ``prepare`` does once the records are read: the same function for the runner and for the
    planner, which counts with it what the runner will train (pure: no torch)."""
    stats = DataStats()
    examples: list[Example] = []
    for line, record in records:
        stats.records += 1
        try:
            ids, labels = encode_record(record, tokenizer)
        except DatasetError as exc:
            if exc.uri is None:
                raise DatasetError(str(exc), uri=uri, line=line) from None
            raise
        example = fit_example(ids, labels, line, seq_len=seq_len, overlong=overlong, stats=stats)
        if example is not None:
            examples.append(example)
    if stats.records == 0:
        raise DatasetError("dataset is empty: no records to train on", uri=uri)
    if not examples:
        raise DatasetError(
            f"no usable records: all {stats.records} were dropped (longer than seq_len={seq_len} "
            f"with overlong={overlong!r}, or without tokens to train on)",
            uri=uri,
        )
    train, evaluation = split(examples, eval_fraction, seed=seed)
    stats.examples = len(examples)
    stats.tokens = sum(len(e) for e in examples)
    stats.trainable_tokens = sum(e.trainable_tokens for e in examples)
    stats.train_examples, stats.eval_examples = len(train), len(evaluation)
    return PreparedData(train=train, eval=evaluation, stats=stats)


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
    train); None is the automatic split (runner.spec.Defaults: 5% of 1,000 examples or more, at most 200)."""
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
