"""From a JobSpec's dataset to tokenized train and eval examples, with counts for the run summary."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runner.contract.example import Example
from runner.contract.fitting import DataStats, fit_example, split
from runner.contract.records import DatasetError, Record, read_records
from runner.contract.spec import JobSpec
from runner.contract.tokenize import encode_record


@dataclass
class PreparedData:
    train: list[Example]
    eval: list[Example] = field(default_factory=list)
    stats: DataStats = field(default_factory=DataStats)


def prepare(
    spec: JobSpec, tokenizer: Any, *, records: Iterable[tuple[int, Record]] | None = None
) -> PreparedData:
    """Read, check, tokenize, fit to seq_len and split the dataset of ``spec`` (or the already read
    ``records``, (line, record) pairs from ``runner.contract.records.read_records``).

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
