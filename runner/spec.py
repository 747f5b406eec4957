"""The contract between the bot and the runner: JobSpec (bot -> runner) and RunnerEvent (runner -> bot).

This module is the only part of ``runner`` the bot imports, so it must stay light: pydantic and the
standard library only, never torch. Both models are versioned; a reader rejects a major version it
does not know instead of guessing. Secrets (HF token, W&B key, storage keys) never travel inside a
JobSpec: they are environment variables of the runner process. The report token is the one
exception; it is a per-job bearer token that only authorises posting this job's events.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SPEC_VERSION = 1

# Exit codes of `tunebot-runner`: documented, stable, distinct from Python's own 1 (crash) and 2 (usage).
EXIT_OK = 0  # finished (max steps/epochs reached, or stopped on a plateau)
EXIT_FAILED = 1  # training failed; the summary line says why
EXIT_BAD_SPEC = 2  # the spec or the dataset is invalid; nothing was trained
EXIT_PREEMPTED = 75  # SIGTERM received: the current step finished, a checkpoint was saved (EX_TEMPFAIL)


class Method(StrEnum):
    full = "full"
    lora = "lora"
    qlora = "qlora"


class DatasetFormat(StrEnum):
    alpaca = "alpaca"
    messages = "messages"
    prompt_completion = "prompt_completion"
    text = "text"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSpec(_Strict):
    r: int = Field(16, ge=1, le=1024)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    # "all-linear" or explicit module names such as ["q_proj", "v_proj"].
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class DatasetSpec(_Strict):
    uri: str  # a local path or any fsspec URI (s3://, file://, memory://)
    format: DatasetFormat = DatasetFormat.alpaca
    # Records longer than seq_len are truncated (default) or dropped; either way they are counted.
    overlong: Literal["truncate", "drop"] = "truncate"
    eval_fraction: float = Field(0.0, ge=0.0, lt=0.5)


class CheckpointSpec(_Strict):
    uri: str  # folder or fsspec URI; checkpoints go to <uri>/checkpoint-<step>/ with a COMPLETE marker
    every_minutes: float = Field(20.0, gt=0)
    keep: int = Field(2, ge=1)


class ReportSpec(_Strict):
    callback_url: str | None = None  # POST <callback_url> with "Authorization: Bearer <token>"
    token: str | None = None
    every_seconds: float = Field(30.0, gt=0)


class WandbSpec(_Strict):
    project: str | None = None
    mode: Literal["online", "offline", "disabled"] = "disabled"
    run_id: str | None = None  # fixed so that a resumed run continues the same W&B run


class PlateauSpec(_Strict):
    enabled: bool = True
    patience: int = Field(5, ge=1)  # number of evaluations without improvement before stopping
    min_delta: float = Field(0.01, ge=0.0)  # improvement of the smoothed loss that counts
    ema: float = Field(0.9, ge=0.0, lt=1.0)  # smoothing of the training loss
    every_steps: int = Field(10, ge=1)  # how often the detector looks
    warmup_steps: int = Field(0, ge=0)  # no decision before this many optimizer steps


class JobSpec(_Strict):
    version: int = SPEC_VERSION
    job_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    base_model: str  # hub id (uses HF_TOKEN) or a local path / fsspec URI of a model folder
    dataset: DatasetSpec
    method: Method = Method.lora
    lora: LoraSpec = Field(default_factory=LoraSpec)
    seq_len: int = Field(2048, ge=8, le=1_048_576)
    micro_batch_size: int = Field(1, ge=1, le=4096)
    grad_accum: int = Field(1, ge=1, le=65536)
    epochs: float = Field(1.0, gt=0, le=1000)
    max_steps: int | None = Field(None, ge=1)  # overrides epochs when set
    learning_rate: float = Field(2e-4, gt=0, lt=1)
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_ratio: float = Field(0.03, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = "adamw"
    packing: bool = True
    gradient_checkpointing: bool = True
    attn: Literal["eager", "sdpa", "flash"] = "sdpa"
    gpus: int = Field(1, ge=0, le=1024)  # 0 = CPU
    checkpoint: CheckpointSpec
    report: ReportSpec = Field(default_factory=ReportSpec)
    wandb: WandbSpec = Field(default_factory=WandbSpec)
    plateau: PlateauSpec = Field(default_factory=PlateauSpec)
    seed: int = 42
    output_uri: str

    @model_validator(mode="after")
    def _known_version(self) -> JobSpec:
        if self.version > SPEC_VERSION:
            raise ValueError(f"JobSpec version {self.version} is newer than this runner ({SPEC_VERSION})")
        return self

    def redacted(self) -> JobSpec:
        """A copy without the report token, for everything written to disk, W&B or the output."""
        return self.model_copy(update={"report": self.report.model_copy(update={"token": None})})

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step consumes on one process (shared with the planner's arithmetic)."""
        return self.seq_len * self.micro_batch_size * self.grad_accum


class EventKind(StrEnum):
    started = "started"
    progress = "progress"
    checkpoint = "checkpoint"
    plateau = "plateau"
    finished = "finished"
    failed = "failed"
    preempted = "preempted"


TERMINAL_EVENTS = frozenset({EventKind.finished, EventKind.failed, EventKind.plateau})


class RunnerEvent(BaseModel):
    """One thing that happened in a run; `seq` increases strictly within a job, across resumes."""

    model_config = ConfigDict(extra="ignore")

    version: int = SPEC_VERSION
    job_id: str
    seq: int = Field(ge=0)
    kind: EventKind
    step: int = 0
    max_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    tokens_per_second: float | None = None
    tokens_seen: int | None = None
    eta_seconds: float | None = None
    checkpoint_uri: str | None = None
    output_uri: str | None = None
    message: str | None = None
    timestamp: float = Field(default_factory=time.time)


class RunSummary(BaseModel):
    """The runner's last line of stdout: one JSON object."""

    status: Literal["finished", "plateau", "preempted", "failed", "invalid"]
    steps: int = 0
    max_steps: int | None = None
    tokens: int = 0
    final_loss: float | None = None
    wall_seconds: float = 0.0
    resumed_from: str | None = None
    output_uri: str | None = None
    records_truncated: int = 0
    records_dropped: int = 0
    message: str | None = None


# The progress object: the runner writes it beside its checkpoints so that a bot without a public URL
# (Slack Socket Mode) can pull what it would otherwise be pushed. Shape:
#   {"job_id": str, "updated": unix seconds, "last_seq": int, "events": [RunnerEvent as dict, ... last 200]}
PROGRESS_FILE = "progress.json"


def progress_uri(checkpoint_uri: str) -> str:
    """Where the progress object of a job lives: ``<checkpoint uri>/progress.json``."""
    return f"{checkpoint_uri.rstrip('/')}/{PROGRESS_FILE}"


def parse_progress(data: bytes | str) -> list[RunnerEvent]:
    """The events of a progress object, oldest first (events of unknown kinds or versions are skipped)."""
    import json

    obj = json.loads(data)
    if not isinstance(obj, dict) or not isinstance(obj.get("events"), list):
        raise ValueError("not a tunebot progress object (expected an object with an 'events' list)")
    events: list[RunnerEvent] = []
    for raw in obj["events"]:
        try:
            event = RunnerEvent.model_validate(raw)
        except ValueError:
            continue  # a newer runner may report kinds this bot does not know; keep the rest readable
        if event.version <= SPEC_VERSION:
            events.append(event)
    return sorted(events, key=lambda e: e.seq)
