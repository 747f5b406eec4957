"""The contract between the bot and the runner: JobSpec (bot -> runner) and RunnerEvent (runner -> bot).

This module is the only part of ``runner`` the bot imports, so it must stay light: pydantic and the
standard library only, never torch. Both models are versioned; a reader rejects a major version it
does not know instead of guessing. Secrets (HF token, W&B key, storage keys) never travel inside a
JobSpec: they are environment variables of the runner process. The report token is the one
exception; it is a per-job bearer token that only authorises posting this job's events.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from runner.contract.phases import bounded as bounded_phases

SPEC_VERSION = 1

# Exit codes of `tunebot-runner`: documented, stable, distinct from Python's own 1 (crash) and 2 (usage).
EXIT_OK = 0  # finished (max steps/epochs reached, or stopped on a plateau)
EXIT_FAILED = 1  # training failed; the summary line says why
EXIT_BAD_SPEC = 2  # the spec or the dataset is invalid; nothing was trained
EXIT_PREEMPTED = 75  # SIGTERM received: the current step finished, a checkpoint was saved (EX_TEMPFAIL)
# Out of GPU memory even at micro-batch 1 with activation checkpointing on (runner/oom.py): the bot relaunches
# on an offer with more memory per GPU (bot/engine/watching/grow.py). Nothing was lost: checkpoints are as
# they were.
EXIT_OUT_OF_MEMORY = 76
# Storage credentials about to expire and not renewed (runner/credentials.py): a checkpoint was saved;
# the bot relaunches with fresh ones.
EXIT_CREDENTIALS = 77
# The runner could not be installed on a stock image (runner/bootstrap.py: fetch, SHA-256 check or pip install
# failed): nothing was trained; the bot retries once on another host, then fails the job saying so.
EXIT_INSTALL = 78
# The job's paid time reached its spend cap (JobSpec.cost.max_cost), counted by the runner itself: a
# checkpoint was saved and a `budget` event sent. The runner's own stop, for when no bot is alive to stop it.
EXIT_BUDGET = 79

# The runner's chunked cross-entropy (runner/loss.py) computes at most this many logits at once; the planner
# prices a chunk of chunk_tokens(vocab) tokens instead of the whole sequence's logits.
CHUNK_LOGIT_ELEMENTS = 2**24


def chunk_tokens(vocab: int) -> int:
    """Label tokens per chunk of the chunked loss: 130 with Llama 3's 128,256 entries, 524 with 32,000."""
    return max(1, CHUNK_LOGIT_ELEMENTS // max(1, vocab))


class Defaults:
    """Training defaults, written once. The bot's request (bot/planner/request.py) takes its defaults from
    here too, so an estimate prices and shows exactly what the runner does when an option is not given."""

    lora_r = 16
    lora_alpha_per_r = 2  # alpha = 2 x r when not given (the usual LoRA choice)
    lora_dropout = 0.0  # peft's default; > 0 keeps a dropout copy of each adapted input (priced)
    learning_rate = 2e-4  # LoRA / QLoRA: adapters start at zero and need a large rate
    full_learning_rate = 2e-5  # full fine-tuning moves every weight: 1e-5 to 5e-5 is the usual range
    # How the trained weights are held on a GPU: a full fine-tune keeps fp32 master weights (and fp32 grads
    # and AdamW states) and computes in bf16 under autocast ("mixed", 16-18 B/param); LoRA / QLoRA train fp32
    # adapters on a bf16 base ("bf16": peft's own mixed precision). "bf16" for a full fine-tune is pure
    # bf16 (8 B/param, updates below bf16's resolution are lost); "fp32" computes in fp32. CPU: all fp32.
    full_precision = "mixed"
    adapter_precision = "bf16"
    lr_scheduler = "cosine"
    warmup_ratio = 0.03
    weight_decay = 0.0
    epochs = 1.0
    seed = 42
    # The eval split when none is asked for (eval= not given: None, "auto"): 5% of the examples held out,
    # at most 200, and only on datasets of 1,000 examples or more (a small dataset needs every example to
    # train on; eval=5% asks for a split on any dataset, eval=0 for none). runner/contract/fitting.eval_size
    # is the one rule; the planner counts with it.
    eval_fraction: float | None = None
    auto_eval_fraction = 0.05
    auto_eval_min_examples = 1000
    auto_eval_max_examples = 200
    # With an eval split the result is the checkpoint with the lowest eval loss ("best"), else the last step.
    keep_with_eval = "best"
    # Side-by-side answers of the base and the tuned model (runner/samples.py): a few held-out examples'
    # prompts (or prompts=FILE), greedy decoding (deterministic), at most sample_tokens new tokens each.
    samples = 3
    max_samples = 8
    sample_tokens = 48
    sample_prompt_tokens = 192  # a prompt is cut to its last tokens past this (bounded generation)
    plateau = True
    plateau_patience = 10  # evaluations in a row without improvement
    plateau_min_delta = 0.01
    plateau_ema = 0.95
    plateau_evaluations = 50  # the detector looks max_steps / 50 times (every 10 steps at least)
    plateau_warmup = 0.10  # no decision in the first 10% of the steps
    hub_private = True
    # The loss: "chunked" (runner/loss.py: never the whole sequence's logits at once), "plain" (the model's
    # logits upcast to fp32, as the Hugging Face Trainer does) or "liger" (Liger's fused kernel, CUDA). The
    # planner writes "plain" where the card holds the logits and "chunked" where memory needs it
    # (bot/planner/batch_choice.py); with Liger's kernels running the loss is Liger's fused one either way.
    loss = "chunked"
    # Liger's Triton kernels (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy) on CUDA where liger-kernel
    # installs (runner/kernels.py: a line in the job's log when they do not); "torch" never uses them.
    kernels = "liger"

    @staticmethod
    def learning_rate_for(method: str) -> float:
        return Defaults.full_learning_rate if method == "full" else Defaults.learning_rate

    @staticmethod
    def precision_for(method: str) -> str:
        return Defaults.full_precision if method == "full" else Defaults.adapter_precision


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
    r: int = Field(Defaults.lora_r, ge=1, le=1024)
    alpha: int = Field(Defaults.lora_r * Defaults.lora_alpha_per_r, ge=1)
    dropout: float = Field(Defaults.lora_dropout, ge=0.0, lt=1.0)
    # "all-linear" or explicit module names such as ["q_proj", "v_proj"].
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class DatasetSpec(_Strict):
    uri: str  # a local path or any fsspec URI (s3://, file://, memory://)
    name: str | None = None  # what the person gave (the model card); uri is where the runner reads it
    format: DatasetFormat = DatasetFormat.alpaca
    # Records longer than seq_len are truncated (default) or dropped; either way they are counted.
    overlong: Literal["truncate", "drop"] = "truncate"
    # None: the automatic split (Defaults.eval_fraction: 5% of 1,000+ examples, at most 200).
    eval_fraction: float | None = Field(Defaults.eval_fraction, ge=0.0, lt=0.5)


class SamplesSpec(_Strict):
    """Answers of the base model and of the tuned one to the same prompts, side by side (runner/samples.py).

    ``prompts_uri``: a jsonl of prompts ({"prompt": ...}, {"messages": [...]} or alpaca's instruction/input);
    None: the first ``count`` held-out eval examples' prompts (none without an eval split)."""

    count: int = Field(Defaults.samples, ge=0, le=Defaults.max_samples)
    # The prompts themselves, one JSON object each as in a prompts file: the bot reads prompts=FILE (bounded,
    # checked with runner/contract/prompts.py) and sends them inline, so no host needs to reach the file.
    prompts: list[dict[str, Any]] | None = Field(None, max_length=Defaults.max_samples)
    prompts_uri: str | None = None  # or a file the runner reads (a runner started by hand)
    max_new_tokens: int = Field(Defaults.sample_tokens, ge=1, le=512)


class CheckpointSpec(_Strict):
    uri: str  # folder or fsspec URI; checkpoints go to <uri>/checkpoint-<step>/ with a COMPLETE marker
    every_minutes: float = Field(20.0, gt=0)
    keep: int = Field(2, ge=1)


class ReportSpec(_Strict):
    callback_url: str | None = None  # POST <callback_url> with "Authorization: Bearer <token>"
    token: str | None = None
    every_seconds: float = Field(30.0, gt=0)
    # The heartbeat's own cadence, whatever every_seconds says (runner/contract/heartbeat.py).
    heartbeat_seconds: float = Field(30.0, gt=0)


# The most an online W&B start may hold a run before it logs offline instead (runner/wandb_log.py; the
# TUNEBOT_WANDB_INIT_TIMEOUT setting overrides it): the planner prices an online start at it.
WANDB_INIT_TIMEOUT_S = 3.0


class WandbSpec(_Strict):
    project: str | None = None
    entity: str | None = None  # team or user; None = the API key's default entity
    mode: Literal["online", "offline", "disabled"] = "disabled"
    run_id: str | None = None  # fixed so that a resumed run continues the same W&B run


class PlateauSpec(_Strict):
    enabled: bool = Defaults.plateau
    patience: int = Field(Defaults.plateau_patience, ge=1)  # evaluations in a row without improvement
    min_delta: float = Field(Defaults.plateau_min_delta, ge=0.0)  # improvement of the smoothed loss
    ema: float = Field(Defaults.plateau_ema, ge=0.0, lt=1.0)  # smoothing of the training loss
    # How often the detector looks; None: max(10, max_steps / 50), so patience covers a share of the run.
    every_steps: int | None = Field(None, ge=1)
    warmup_steps: int | None = Field(None, ge=0)  # no decision before this step; None: 10% of max_steps

    def resolved(self, max_steps: int) -> PlateauSpec:
        """This spec with the automatic values filled in for a run of ``max_steps`` optimizer steps."""
        every = self.every_steps or max(10, -(-max_steps // Defaults.plateau_evaluations))
        warmup = self.warmup_steps
        if warmup is None:
            warmup = int(max_steps * Defaults.plateau_warmup)
        return self.model_copy(update={"every_steps": every, "warmup_steps": warmup})


class StageSpec(_Strict):
    """A sweep's stage boundaries (bot/engine/control/sweeps.py): at each of ``steps`` (before the last) the
    runner evaluates, saves a checkpoint, reports both and waits for the sweep's decision
    (runner/contract/stage.py) instead of training on; a run the sweep stops never trains past its stage."""

    steps: list[int] = Field(default_factory=list, max_length=16)
    poll_seconds: float = Field(2.0, gt=0, le=60)  # how often a paused run looks for the decision


class VerifySpec(_Strict):
    """Another run's output to measure on this job's held-out split instead of training (runner/verify.py):
    a sweep's winner, measured again on a host its own does not control (bot/engine/control/verify.py)."""

    job_id: str = Field(min_length=1, max_length=64)  # whose output it is (its manifest names that job)
    uri: str = Field(min_length=1, max_length=1024)  # the output folder
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # the digest its run reported, signed


class HubSpec(_Strict):
    """Where the output goes on the Hugging Face Hub. The bot pushes it, with its own token, from the output
    its run signed (bot/engine/outcome/hub_push.py); a host never holds a token that can write to the Hub. The
    runner names the repo in the model card."""

    repo: str = Field(min_length=3, max_length=200, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
    private: bool = Defaults.hub_private


class ResumePoint(_Strict):
    """A checkpoint the bot acknowledged from the run that wrote it (bot/engine/record/runs.py): where it is,
    its step and the SHA-256 of its manifest's bytes. A resume loads a checkpoint of an earlier run only
    through one of these (runner/contract/manifest.py ``fetch_pinned``): the manifest must hash to the digest
    the bot recorded while that run was current, whoever can still write the folder."""

    uri: str = Field(min_length=1, max_length=1024)  # <folder>/checkpoint-<step>
    step: int = Field(ge=0)
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def billed_cost(seconds: float, price_per_hour: float) -> float:
    """The one spend formula: billed seconds at the price locked at launch. The bot's ledger
    (bot/engine/record/spend.py ``cost``) and the runner's own stop at the cap (``CostSpec.paid``) both use
    it."""
    return max(0.0, seconds) * price_per_hour / 3600.0


class CostSpec(_Strict):
    """What the bot knows about the money: for the model card, and for the runner's own stop at the cap
    (a second line of defence: it holds with no bot alive to stop the job)."""

    price_per_hour: float | None = Field(None, ge=0)  # the instance's locked price
    spent_before: float = Field(0.0, ge=0)  # spend of the job's earlier instances (preempted runs)
    estimated_total: float | None = Field(None, ge=0)
    where: str | None = None  # "vast rtx-4090 x1 (spot)"
    max_cost: float | None = Field(None, gt=0)  # the job's spend cap: the runner stops itself there
    # When this run's billing began at the earliest, on the bot's clock (the launch call; the provider bills
    # from its own creation time, a little later). The time before the runner started (boot, image, model) is
    # counted from it, but never more than ``max_start_s``: a host clock that is far off neither stops a
    # run at once nor hides its boot.
    billed_from: float | None = Field(None, ge=0)
    max_start_s: float = Field(3600.0, ge=0)

    def paid(self, started_at: float, ran_s: float) -> float | None:
        """The job's spend at the locked price once this run has run ``ran_s`` seconds since the runner
        started at ``started_at`` (its wall clock): the earlier runs' spend, the boot, this run. None when
        the price is not known."""
        if self.price_per_hour is None:
            return None
        boot = 0.0
        if self.billed_from is not None:
            boot = min(max(0.0, started_at - self.billed_from), self.max_start_s)
        return self.spent_before + billed_cost(boot + ran_s, self.price_per_hour)


class JobSpec(_Strict):
    version: int = SPEC_VERSION
    job_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # This launch of the job (bot/engine/record/runs.py): its own key (TUNEBOT_JOB_KEY), folder and
    # credentials.
    run_id: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    base_model: str  # hub id (uses HF_TOKEN) or a local path / fsspec URI of a model folder
    base_model_name: str | None = None  # what the person asked for (hub id or name; for the model card)
    dataset: DatasetSpec
    method: Method = Method.lora
    lora: LoraSpec = Field(default_factory=LoraSpec)
    seq_len: int = Field(2048, ge=8, le=1_048_576)
    micro_batch_size: int = Field(1, ge=1, le=4096)
    grad_accum: int = Field(1, ge=1, le=65536)
    epochs: float = Field(Defaults.epochs, gt=0, le=1000)
    max_steps: int | None = Field(None, ge=1)  # optimizer steps; overrides epochs (runner/contract/steps.py)
    # Not given: Defaults.learning_rate_for(method) (2e-4 for adapters, 2e-5 for a full fine-tune).
    learning_rate: float = Field(Defaults.learning_rate, gt=0, lt=1)
    lr_scheduler: Literal["cosine", "linear", "constant"] = Defaults.lr_scheduler  # type: ignore[assignment]
    warmup_ratio: float = Field(Defaults.warmup_ratio, ge=0, lt=1)
    weight_decay: float = Field(Defaults.weight_decay, ge=0)
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit"] = "adamw"
    # How torch's AdamW runs (optimizer "adamw"): "fused" on CUDA (the default: updates in place), "foreach"
    # (one temporary the size of the optimizer states in each step, priced by the planner) or "for-loop".
    optimizer_impl: Literal["fused", "foreach", "for-loop"] = "fused"
    # None: Defaults.precision_for(method) ("mixed" for full: fp32 master weights + bf16 autocast; "bf16" for
    # adapters on a bf16 base). See Defaults.full_precision.
    precision: Literal["mixed", "bf16", "fp32"] | None = None
    packing: bool = True
    gradient_checkpointing: bool = True
    attn: Literal["eager", "sdpa", "flash"] = "sdpa"
    loss: Literal["chunked", "plain", "liger"] = Defaults.loss  # type: ignore[assignment]
    kernels: Literal["liger", "torch"] = Defaults.kernels  # type: ignore[assignment]
    gpus: int = Field(1, ge=0, le=1024)  # 0 = CPU
    # How several processes share the model: "fsdp" (weights, gradients and optimizer states sharded, what
    # the planner prices for every method on > 1 GPU), "ddp" (a full copy per process) or "auto" (= fsdp).
    sharding: Literal["auto", "fsdp", "ddp"] = "auto"
    checkpoint: CheckpointSpec
    # Checkpoints of earlier runs this run may resume from, newest first, each pinned by its manifest's
    # digest (its own checkpoint folder, signed with its own key, is looked at first).
    resume: list[ResumePoint] = Field(default_factory=list, max_length=8)
    report: ReportSpec = Field(default_factory=ReportSpec)
    wandb: WandbSpec = Field(default_factory=WandbSpec)
    plateau: PlateauSpec = Field(default_factory=PlateauSpec)
    seed: int = Defaults.seed
    output_uri: str
    push_to_hub: HubSpec | None = None
    merge: bool = False  # also save the base model with the adapter merged in (<output>/merged)
    cost: CostSpec = Field(default_factory=CostSpec)
    # The result: "best" (the lowest eval loss) or "last" (the last step); None: best with an eval split, else
    # last. On several processes the result is the last step (the best weights are not gathered there).
    keep: Literal["best", "last"] | None = None
    samples: SamplesSpec = Field(default_factory=SamplesSpec)
    stages: StageSpec | None = None  # a sweep's run: where it pauses for the sweep's decision
    verify: VerifySpec | None = None  # a verification run: measure that output, train nothing

    @model_validator(mode="after")
    def _known_version(self) -> JobSpec:
        if self.version > SPEC_VERSION:
            raise ValueError(f"JobSpec version {self.version} is newer than this runner ({SPEC_VERSION})")
        if "learning_rate" not in self.model_fields_set:  # past __setattr__: still "not given"
            self.__dict__["learning_rate"] = Defaults.learning_rate_for(self.method.value)
        return self

    @property
    def resolved_precision(self) -> str:
        """ "mixed", "bf16" or "fp32": as given, else the method's default (Defaults.precision_for)."""
        if self.precision is None:
            return Defaults.precision_for(self.method.value)
        return "bf16" if self.precision == "mixed" and self.method is not Method.full else self.precision

    def redacted(self) -> JobSpec:
        """A copy without the report token, for everything written to disk, W&B or the output."""
        return self.model_copy(update={"report": self.report.model_copy(update={"token": None})})

    def strategy(self, processes: int) -> Literal["none", "fsdp", "ddp"]:
        """How `processes` workers share the model for this spec: one process shares nothing."""
        if processes <= 1:
            return "none"
        return "ddp" if self.sharding == "ddp" else "fsdp"

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
    warning = "warning"  # something the person should know (a checkpoint skipped because it did not verify)
    # Out of memory at every back-off level (runner/oom.py): the job needs a GPU with more memory.
    out_of_memory = "out_of_memory"
    # What the run bought, right before its terminal event: eval loss before and after, the kept step and
    # the side-by-side answers (RunResults, within RESULTS_EVENT_BYTES).
    results = "results"
    # The job's paid time reached its spend cap: the runner saved a checkpoint and stopped (EXIT_BUDGET).
    budget = "budget"


TERMINAL_EVENTS = frozenset(
    {EventKind.finished, EventKind.failed, EventKind.plateau, EventKind.out_of_memory, EventKind.budget}
)


# Every cap on an event, for both sides. How much one event and one progress object may be: the bot refuses
# anything bigger (bot/engine/launching/integrity.py), and the runner never sends anything bigger
# (``report_events`` splits a report into events of at most MAX_EVENT_BYTES and MAX_EVENT_POINTS each: both
# are checked on both sides, tests/engine/test_event_contract.py). One event is measured as canonical JSON
# (runner/contract/integrity.canonical: what its MAC covers).
MAX_EVENT_BYTES = 16 * 1024
MAX_PROGRESS_BYTES = 4 * 1024 * 1024  # a progress object (the runner keeps 200 events: 3.3 MB at most)
MAX_EVENT_POINTS = 512  # chart points (or evals) one event may carry (RunnerEvent refuses more)
MAX_REPORT_POINTS = 2048  # chart points one report keeps (thin_points: evenly spread, the newest exact)
MAX_URI_CHARS = 1024  # a link longer than this is dropped (by the runner and by the bot)
MAX_MESSAGE_CHARS = 2000  # the bot keeps this much of an event's message
MAX_EVENT_METRICS = 32  # metrics one event keeps (the first ones; the runner and the bot cut alike)
MAX_METRIC_NAME = 64  # characters of a metric's name: a longer one is dropped


def thin_points(points: list[Any], limit: int = MAX_REPORT_POINTS) -> list[Any]:
    """At most ``limit`` points, evenly spread, the newest kept (a fast run's steps between two reports)."""
    if len(points) <= limit:
        return list(points)
    stride = -(-len(points) // limit)
    kept = points[::stride]
    if kept[-1] is not points[-1]:
        kept = kept[: limit - 1] + [points[-1]]
    return kept


# The results event stays well under the bot's 16 KB event cap
# (bot/engine/launching/integrity.MAX_EVENT_BYTES) however long the answers are: fit_results shortens the
# texts until the event's JSON fits this many bytes.
RESULTS_EVENT_BYTES = 10 * 1024
MAX_SAMPLE_TEXT = 2000  # characters of one prompt or answer in a results event (before fitting)


class Sample(BaseModel):
    """One prompt and what each model answered (``expected``: the held-out example's own answer)."""

    model_config = ConfigDict(extra="ignore")

    prompt: str = Field("", max_length=MAX_SAMPLE_TEXT)
    base: str = Field("", max_length=MAX_SAMPLE_TEXT)
    tuned: str = Field("", max_length=MAX_SAMPLE_TEXT)
    expected: str | None = Field(None, max_length=MAX_SAMPLE_TEXT)


class RunResults(BaseModel):
    """What the money bought, measured on the held-out split: the base model's eval loss before training,
    the result's after, which step the result is (and why), and the side-by-side answers."""

    model_config = ConfigDict(extra="ignore")

    eval_before: float | None = None  # the base model (step 0)
    eval_after: float | None = None  # the kept result
    last_eval: float | None = None  # the last step's (differs from eval_after when the best is kept)
    evaluations: int = Field(0, ge=0)  # eval passes after step 0
    keep: Literal["best", "last"] = "last"
    result_step: int = Field(0, ge=0)  # the step whose weights are the result
    last_step: int = Field(0, ge=0)
    why: str | None = Field(None, max_length=500)  # "lowest eval loss of 5 evaluations", ...
    samples: list[Sample] = Field(default_factory=list, max_length=Defaults.max_samples)
    sample_tokens: int = 0  # the bound on each answer (new tokens)

    @property
    def change(self) -> float | None:
        """after / before - 1 (-0.38 for 2.31 -> 1.42); None without both."""
        if self.eval_before is None or self.eval_after is None or self.eval_before <= 0:
            return None
        return self.eval_after / self.eval_before - 1.0


def fit_results(results: RunResults, limit: int = RESULTS_EVENT_BYTES) -> RunResults:
    """``results`` with its sample texts shortened (longest first, an ellipsis where cut) until its JSON
    takes at most ``limit`` bytes: one results event always fits the bot's event cap."""
    import json

    def size(r: RunResults) -> int:
        return len(json.dumps(r.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":")))

    out = results.model_copy(deep=True)
    cap = MAX_SAMPLE_TEXT
    while size(out) > limit and cap > 16:
        cap = cap * 3 // 4
        out.samples = [
            Sample(
                prompt=_clip(s.prompt, cap),
                base=_clip(s.base, cap),
                tuned=_clip(s.tuned, cap),
                expected=None if s.expected is None else _clip(s.expected, cap),
            )
            for s in out.samples
        ]
    while size(out) > limit and out.samples:
        out.samples = out.samples[:-1]
    return out


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


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
    # Every optimizer step since the previous event as [step, train loss, learning rate], and the eval losses
    # measured since then as [step, eval loss]: the job's chart draws every step from step 1, not only the
    # steps a report happened to land on. NaN travels as null.
    points: list[tuple[int, float | None, float | None]] | None = Field(None, max_length=MAX_EVENT_POINTS)
    evals: list[tuple[int, float | None]] | None = Field(None, max_length=MAX_EVENT_POINTS)
    tokens_per_second: float | None = None
    tokens_seen: int | None = None
    eta_seconds: float | None = None
    checkpoint_uri: str | None = None
    output_uri: str | None = None
    message: str | None = None
    wandb_url: str | None = None  # the W&B run page (on `started` when logging online)
    wandb_note: str | None = None  # on `started`: W&B did not answer, the run logs offline (and where)
    hub_url: str | None = None  # where the output was pushed (runners before the bot pushed; ignored now)
    # The SHA-256 of the manifest's bytes: a checkpoint's (checkpoint, preempted) or the output's (finished,
    # plateau). The bot records it from the current run's signed event: what a later resume or the bot's Hub
    # push accepts (bot/engine/record/runs.py).
    manifest_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    timestamp: float = Field(default_factory=time.time)
    # What this run measured (terminal events; see runner/measure.py): max_memory_reserved_gb,
    # device_memory_used_gb, tokens_per_second (steady), steady_steps. Absent values were not measurable.
    metrics: dict[str, float | None] | None = None
    results: RunResults | None = None  # on the `results` event
    # Where the job's time went, by phase (runner/contract/phases.py): seconds since the instance started, on
    # terminal, preempted and progress events; across resumes, each earlier run's up to its last checkpoint.
    # A host's claim: bounded (known names, finite, within MAX_PHASE_SECONDS); it decides no money.
    phases: dict[str, float] | None = None

    @model_validator(mode="after")
    def _finite(self) -> RunnerEvent:
        """NaN and infinities travel as null: strict JSON (a push's body, orjson's reads) has no NaN."""
        for name in ("epoch", "loss", "learning_rate", "tokens_per_second", "eta_seconds"):
            self.__dict__[name] = _finite_or_none(self.__dict__[name])
        for name in ("points", "evals"):
            rows = self.__dict__[name]
            if rows and any(not _all_finite(row) for row in rows):
                self.__dict__[name] = [tuple(_finite_or_none(v) for v in row) for row in rows]
        if self.metrics and not _all_finite(self.metrics.values()):
            self.__dict__["metrics"] = {k: _finite_or_none(v) for k, v in self.metrics.items()}
        return self

    @field_validator("phases", mode="before")
    @classmethod
    def _bounded_phases(cls, value: Any) -> dict[str, float] | None:
        """Known phases with finite seconds in bounds: a host's odd entries are dropped, not its event."""
        return bounded_phases(value)


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _all_finite(values: Iterable[Any]) -> bool:
    return all(not isinstance(v, float) or math.isfinite(v) for v in values)


def event_bytes(event: RunnerEvent) -> int:
    """The size the bot measures an event by: its canonical JSON (the bytes its MAC covers)."""
    from runner.contract.integrity import canonical

    return len(canonical(event.model_dump(mode="json")))


def report_events(
    job_id: str,
    first_seq: int,
    kind: EventKind,
    fields: dict[str, Any],
    *,
    limit: int = MAX_EVENT_BYTES,
    _spare: int = 16,
) -> list[RunnerEvent]:
    """One report as the events that carry it, numbered from ``first_seq``, each at most ``limit`` bytes
    (``event_bytes``) and ``MAX_EVENT_POINTS`` points, whatever the report holds.

    Chart points that do not fit in the report's own event go ahead of it, in step order, in ``progress``
    events of their own (each one's step, loss and learning rate are its last point's); the last event is
    the report itself (its kind and fields) with the newest points. Text too long for any event is cut
    (message, W&B note), over-long links are dropped, metrics kept to MAX_EVENT_METRICS: the bot would cut
    them too."""
    fields = dict(fields)
    # Each point and eval as an event carries it (validated, NaN as null), tagged and in step order (an eval
    # after the point of its step), with its size in the event's JSON.
    points = [_finite_row(p) for p in _POINTS.validate_python(fields.pop("points", None) or [])]
    evals = [_finite_row(e) for e in _EVALS.validate_python(fields.pop("evals", None) or [])]
    head = _fit_text(RunnerEvent(job_id=job_id, seq=first_seq, kind=kind, **fields), limit // 2)
    items = [(p[0], 0, i, _json_len(p)) for i, p in enumerate(points)]
    items += [(e[0], 1, i, _json_len(e)) for i, e in enumerate(evals)]
    items.sort()
    # What is left for chart data in the report's own event and in a progress event of chart data only
    # (a few bytes spare: a later part's seq may be a digit longer; a part's step, loss and rate are numbers).
    room_head = limit - event_bytes(head.model_copy(update={"points": [], "evals": []})) - _spare
    empty = RunnerEvent(job_id=job_id, seq=first_seq, kind=EventKind.progress, max_steps=head.max_steps)
    room_part = limit - event_bytes(empty.model_copy(update={"points": [], "evals": []})) - 80 - _spare
    # Chunks from the newest backwards: the report's own event keeps the newest points.
    chunks: list[list[tuple[int, int, int, int]]] = []
    end = len(items)
    while end > 0 or not chunks:
        start, used, counts = end, 0, [0, 0]
        room = room_part if chunks else room_head
        while start > 0:
            _, which, _, size = items[start - 1]
            if counts[which] >= MAX_EVENT_POINTS or (used + size + 1 > room and start < end):
                break
            start -= 1
            used += size + 1
            counts[which] += 1
        chunks.append(items[start:end])
        end = start
    chunks.reverse()
    out: list[RunnerEvent] = []
    for i, chunk in enumerate(chunks):
        pts = [points[k] for _, which, k, _ in chunk if which == 0]
        evs = [evals[k] for _, which, k, _ in chunk if which == 1]
        chart: dict[str, Any] = {"points": pts or None, "evals": evs or None}
        if i == len(chunks) - 1:
            out.append(RunnerEvent.model_validate({**head.model_dump(), "seq": first_seq + i, **chart}))
            continue
        last = pts[-1] if pts else None
        out.append(
            RunnerEvent(
                job_id=job_id,
                seq=first_seq + i,
                kind=EventKind.progress,
                step=chunk[-1][0],
                max_steps=head.max_steps,
                loss=last[1] if last else None,
                learning_rate=last[2] if last else None,
                timestamp=head.timestamp,
                **chart,
            )
        )
    over = max(event_bytes(e) for e in out) - limit
    if over > 0 and _spare < limit // 4:  # never seen: the sizes above are exact; room for it all the same
        again = {**fields, "points": points, "evals": evals}
        return report_events(job_id, first_seq, kind, again, limit=limit, _spare=2 * (_spare + over))
    return out


_POINTS: TypeAdapter[list[tuple[int, float | None, float | None]]] = TypeAdapter(
    list[tuple[int, float | None, float | None]]
)
_EVALS: TypeAdapter[list[tuple[int, float | None]]] = TypeAdapter(list[tuple[int, float | None]])


def _finite_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_finite_or_none(v) for v in row)


def _json_len(value: Any) -> int:
    import json

    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=True))


def _fit_text(event: RunnerEvent, budget: int) -> RunnerEvent:
    """The event with its text cut until it takes at most ``budget`` bytes (points and evals aside)."""
    update: dict[str, Any] = {}
    for name in ("output_uri", "checkpoint_uri", "wandb_url", "hub_url"):
        value = getattr(event, name)
        if value and len(value) > MAX_URI_CHARS:
            update[name] = None
    if event.metrics and len(event.metrics) > MAX_EVENT_METRICS:
        update["metrics"] = dict(list(event.metrics.items())[:MAX_EVENT_METRICS])
    if event.metrics and any(len(k) > MAX_METRIC_NAME for k in event.metrics):
        metrics = update.get("metrics") or event.metrics
        update["metrics"] = {k: v for k, v in metrics.items() if len(k) <= MAX_METRIC_NAME}
    event = event.model_copy(update=update) if update else event
    while event_bytes(event) > budget:
        texts = {n: getattr(event, n) for n in ("message", "wandb_note") if getattr(event, n)}
        if texts:
            name = max(texts, key=lambda n: len(texts[n]))
            text = texts[name]
            event = event.model_copy(update={name: text[: len(text) // 2] or None})
            continue
        links = {n: getattr(event, n) for n in ("wandb_url", "hub_url", "checkpoint_uri", "output_uri")}
        links = {n: v for n, v in links.items() if v}
        if links:
            event = event.model_copy(update={max(links, key=lambda n: len(links[n])): None})
            continue
        if event.metrics:
            event = event.model_copy(update={"metrics": None})
            continue
        break  # numbers and the job id only: far below any budget the bot sets
    return event


class RunSummary(BaseModel):
    """The runner's last line of stdout: one JSON object."""

    status: Literal["finished", "plateau", "preempted", "failed", "invalid", "out_of_memory", "budget"]
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
    metrics: dict[str, float | None] | None = None  # as in RunnerEvent.metrics
    phases: dict[str, float] | None = None  # as in RunnerEvent.phases

    @field_validator("phases", mode="before")
    @classmethod
    def _bounded_phases(cls, value: Any) -> dict[str, float] | None:
        return bounded_phases(value)


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
    return readable_events(obj["events"])


def readable_events(items: Iterable[Any]) -> list[RunnerEvent]:
    """The items that are events of a spec version this bot reads, in seq order."""
    events: list[RunnerEvent] = []
    for raw in items:
        try:
            event = RunnerEvent.model_validate(raw)
        except ValueError:
            continue  # a newer runner may report kinds this bot does not know; keep the rest readable
        if event.version <= SPEC_VERSION:
            events.append(event)
    return sorted(events, key=lambda e: e.seq)
