"""What the runner will make of a dataset, counted with the runner's own code so the estimate prices the
run that happens: its tokenizer and chat template, loss masks, BOS/EOS, truncation to seq_len, the eval split
(runner/contract/tokenize.py, fitting.py), its packing into micro-batches and the length rules
(runner/contract/steps.py).

The tokenizer is the model's own: from a local model folder, or its tokenizer files fetched from the Hub
(a few MB, cached beside the hub configs; HF_TOKEN for gated repos; HF_ENDPOINT and the offline switches
as for configs: bot/planner/models.hub_url). It is loaded as a ``PreTrainedTokenizerFast``: transformers
without torch (the bot never imports torch). Records beyond MAX_EXACT_RECORDS are not all tokenized: an
evenly spaced sample is, and the others' lengths follow from their characters by the sample's
tokens-per-character fit (as the source says).

None (the caller falls back to bot/planner/tokens.py's approximation) when no tokenizer can be had, or when
the dataset is larger than what one estimate reads (TUNEBOT_DATASET_SAMPLE_MB: the approximation samples).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from bot.planner.errors import BadRequestError
from bot.planner.request import EstimateRequest
from bot.planner.resolved import DataPlan

MAX_EXACT_RECORDS = 5_000  # tokenized one by one; beyond, a sample is and the rest scale by characters
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)
MAX_TOKENIZER_FILE_BYTES = 64 * 2**20  # Gemma's tokenizer.json, the largest common one, is ~34 MB


def plan_data(req: EstimateRequest, fmt: str) -> DataPlan | None:
    """The DataPlan of ``req.dataset`` in format ``fmt``; None without the model's tokenizer."""
    assert req.dataset
    tokenizer = tokenizer_for(req.model)
    if tokenizer is None:
        return None
    from bot.planner.tokens import dataset_limits
    from runner.contract.fitting import DataStats, fit_example, split
    from runner.contract.reading import LineReader
    from runner.contract.records import DatasetError, DatasetFormat, parse_record
    from runner.contract.tokenize import encode_record

    # Read bounded (runner/contract/reading.py: line cap, compression ratio, deadline,
    # TUNEBOT_DATASET_SAMPLE_MB); a dataset larger than the sample is counted by tokens.py's approximation,
    # scaled from its sample.
    reader = LineReader(req.dataset, dataset_limits().with_records(None))
    try:
        records = [
            (line, parse_record(text, DatasetFormat(fmt), uri=req.dataset, line=line))
            for line, text in reader
        ]
    except DatasetError as exc:
        raise BadRequestError(str(exc)) from None
    if reader.stopped is not None:
        return None
    if not records:
        raise BadRequestError(f"dataset {req.dataset} has no examples")
    n = len(records)
    exact = (
        set(range(n))
        if n <= MAX_EXACT_RECORDS
        else {i * n // MAX_EXACT_RECORDS for i in range(MAX_EXACT_RECORDS)}
    )
    stats = DataStats()
    lengths: list[int | None] = []
    sampled: list[tuple[int, int]] = []  # (characters, tokens before truncation)
    for index, (line, record) in enumerate(records):
        if index not in exact:
            lengths.append(None)
            continue
        try:
            ids, labels = encode_record(record, tokenizer)
        except DatasetError as exc:
            raise BadRequestError(f"{req.dataset}:{line}: {exc}") from None
        sampled.append((_characters(record), len(ids)))
        example = fit_example(ids, labels, line, seq_len=req.seq_len, overlong="truncate", stats=stats)
        lengths.append(len(example) if example is not None else -1)
    if len(exact) < n:
        per_char, fixed = _fit(sampled)
        for index, (_, record) in enumerate(records):
            if lengths[index] is None:
                estimated = max(1, round(fixed + per_char * _characters(record)))
                lengths[index] = min(estimated, req.seq_len)
    kept = [length for length in lengths if length is not None and length > 0]
    if not kept:
        raise BadRequestError(f"dataset {req.dataset}: no usable records (none has tokens to train on)")
    train, evaluation = split(kept, req.eval_split, seed=req.seed)
    return DataPlan(
        train_lengths=train,
        eval_lengths=evaluation,
        records=n,
        tokenized=len(exact),
        truncated=stats.truncated,
        dropped=stats.dropped,
    )


def _characters(record: Any) -> int:
    from runner.contract.records import Conversation, PromptCompletion

    if isinstance(record, PromptCompletion):
        return len(record.prompt) + len(record.completion)
    if isinstance(record, Conversation):
        return sum(len(m.get("content", "")) for m in record.messages)
    return len(getattr(record, "text", ""))


def _fit(points: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """Least squares tokens = fixed + per_char x characters over the sampled records."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return 0.0, mean_y
    per_char = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
    return per_char, mean_y - per_char * mean_x


# ---- the model's tokenizer -------------------------------------------------------------------------------


def tokenizer_for(model: str) -> Any | None:
    """The model's fast tokenizer (local folder, or its files from the Hub), or None."""
    folder = _local_folder(model) or _hub_folder(model.strip())
    return _load(str(folder)) if folder is not None else None


def _local_folder(model: str) -> Path | None:
    try:
        path = Path(model).expanduser()
        if path.is_file():
            path = path.parent
        return path if (path / "tokenizer.json").is_file() else None
    except (OSError, ValueError):
        return None


class _NoTorchAdvice(logging.Filter):
    """transformers says "PyTorch was not found. Models won't be available ..." when it is imported without
    torch: the bot never imports torch (it reads tokenizers only), so on a bot-only install the line is noise
    in every estimate. Only that line is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


_NO_TORCH_ADVICE = _NoTorchAdvice()


@lru_cache(maxsize=8)
def _load(folder: str) -> Any | None:
    logging.getLogger("transformers").addFilter(_NO_TORCH_ADVICE)  # the same filter once: a set of filters
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    try:
        return PreTrainedTokenizerFast.from_pretrained(folder)
    except Exception:  # noqa: BLE001 - an unreadable tokenizer: the estimate falls back to characters
        return None


def _hub_folder(hub_id: str) -> Path | None:
    """The tokenizer files of a hub repo in the cache (fetched once); None when they cannot be had."""
    from bot.planner.models import HUB_ID, _cache_dir, _hub_offline, hub_url

    if not HUB_ID.match(hub_id):
        return None
    folder = _cache_dir().parent / "hub-tokenizers" / hub_id.replace("/", "--")
    if (folder / "tokenizer.json").is_file():
        return folder
    if _hub_offline():
        return None
    import httpx

    base = hub_url()
    headers = {"Authorization": f"Bearer {os.environ['HF_TOKEN']}"} if os.environ.get("HF_TOKEN") else {}
    fetched: dict[str, bytes] = {}
    try:
        with httpx.Client(headers=headers, timeout=10.0, follow_redirects=True) as client:
            for name in TOKENIZER_FILES:
                data = _get_capped(client, f"{base}/{hub_id}/resolve/main/{name}")
                if data is None and name == "tokenizer.json":
                    return None
                if data is not None:
                    fetched[name] = data
    except httpx.HTTPError:
        return None
    try:
        json.loads(fetched["tokenizer.json"])
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in fetched.items():
            (folder / name).write_bytes(data)
    except (OSError, ValueError):
        return None
    return folder


def _get_capped(client: Any, url: str) -> bytes | None:
    with client.stream("GET", url) as resp:
        if resp.status_code != 200:
            return None
        chunks, size = [], 0
        for chunk in resp.iter_bytes():
            size += len(chunk)
            if size > MAX_TOKENIZER_FILE_BYTES:
                return None
            chunks.append(chunk)
        return b"".join(chunks)
