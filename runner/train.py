"""The training loop: validate, set up, (resume,) train, checkpoint, report, save the output. Top to bottom.

A plain PyTorch loop (torchtune recipe / nanoGPT style) rather than the HF Trainer, so that every piece of
state a resume needs is in plain sight: weights, optimizer, scheduler, RNG, data position (epoch and
micro-batch index: batches are a pure function of (seed, epoch)), plateau detector, reporter seq.

The loss is the mean over all label tokens of one optimizer step (all micro-batches, all ranks), not a
mean of per-micro-batch means, so packing and padding do not change what is optimised.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from runner import checkpoint as ckpt
from runner import loadable
from runner.contract import manifest
from runner.contract.integrity import key_from_env
from runner.contract.spec import (
    EXIT_BAD_SPEC,
    EXIT_BUDGET,
    EXIT_CREDENTIALS,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_OUT_OF_MEMORY,
    EXIT_PREEMPTED,
    Defaults,
    EventKind,
    JobSpec,
    Method,
    RunResults,
    RunSummary,
    Sample,
    billed_cost,
    fit_results,
    thin_points,
)
from runner.distributed import Group, setup, wrap
from runner.oom import OutOfMemory

MAX_GRAD_NORM = 1.0  # gradient clipping, as in most fine-tuning recipes


class InvalidJob(Exception):
    """The spec or dataset cannot be trained (exit 2, status "invalid")."""


class Preemption:
    """SIGTERM, or the bot's signed stop request (runner/contract/stop.py: how a cloud's runner is told),
    sets a flag; the loop finishes the current optimizer step, saves, reports the checkpoint and exits 75."""

    def __init__(self, already: Callable[[], bool] | None = None) -> None:
        self.requested = False
        self.why = "SIGTERM"
        self.credentials = False  # the storage credentials expire: exit 77 instead (a relaunch renews them)
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        if already is not None and already():  # a SIGTERM that came while Python was importing torch
            self._handle(signal.SIGTERM, None)

    def _handle(self, _signum: int, _frame: Any) -> None:
        if not self.requested:
            print("SIGTERM: finishing the current step, then saving a checkpoint", flush=True)
        self.requested = True

    def asked(self, reason: str) -> None:
        """The bot asked this run to stop (its signed request, read by the reporter's thread): as SIGTERM."""
        if not self.requested:
            self.why = f"stop requested by the bot ({reason})"
            print(f"{self.why}: finishing the current step, then saving a checkpoint", flush=True)
        self.requested = True

    def credentials_expiring(self) -> None:
        """The storage credentials were not renewed in time (runner/credentials.py): save, exit 77."""
        self.why = "storage credentials expiring"
        self.credentials = True
        self.requested = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def run(spec: JobSpec, *, sigterm_seen: Callable[[], bool] | None = None) -> tuple[RunSummary, int]:
    """Train `spec` to the end (or plateau, or SIGTERM); return the summary and the exit code."""
    started = time.time()
    from runner.cuda_env import configure_allocator

    if not torch.cuda.is_initialized():  # callers that skip runner/cli.py: still before CUDA starts
        configure_allocator()
    from runner.measure import PhaseClock

    # From the instance's start: every second of the run in one phase (runner/contract/phases.py).
    clock = PhaseClock.for_run(spec.cost.billed_from, spec.cost.max_start_s)
    _cpu_threads(spec)
    preemption = Preemption(sigterm_seen)
    trainer = Trainer(spec, preemption, clock=clock)
    from runner.credentials import Watcher
    from runner.distributed import is_worker

    main_process = not is_worker() or os.environ.get("RANK", "0") == "0"
    watcher = (
        Watcher.start(spec.job_id, preemption.credentials_expiring, run_id=spec.run_id)
        if main_process
        else None
    )
    try:
        trainer.setup()
        if spec.verify is not None:  # a sweep winner measured again, nothing trained (runner/verify.py)
            from runner.verify import verify

            status = verify(trainer)
        else:
            status = trainer.train()
        code = {"preempted": EXIT_PREEMPTED, "budget": EXIT_BUDGET}.get(status, EXIT_OK)
        if status == "preempted" and preemption.credentials:
            code = EXIT_CREDENTIALS  # the bot relaunches it with fresh credentials
        summary = trainer.summary(status, started)
        if status == "budget":  # the summary line says why, as the `budget` event did
            summary.message = trainer.cap_note
        return summary, code
    except OutOfMemory as exc:  # runner/oom.py: every level tried; the bot relaunches on a bigger GPU
        message = f"{exc}; needs a GPU with more memory"
        print(f"error: {message}", file=sys.stderr, flush=True)
        if trainer.group is None or not trainer.group.distributed:  # several: the launcher says it
            trainer.emit(EventKind.out_of_memory, message=message[:2000], metrics=trainer.metrics())
        summary = trainer.summary("out_of_memory", started)
        summary.message = message[:2000]
        return summary, EXIT_OUT_OF_MEMORY
    except InvalidJob as exc:
        # The runner's own error line reaches the person who asked (a `failed` event, then the summary).
        trainer.emit(EventKind.failed, message=f"invalid job: {exc}"[:2000])
        summary = RunSummary(status="invalid", message=str(exc), wall_seconds=time.time() - started)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return summary, EXIT_BAD_SPEC
    except Exception as exc:  # the summary line and a `failed` event say why; the traceback goes to stderr
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}"
        trainer.emit(EventKind.failed, message=message[:2000])
        summary = trainer.summary("failed", started)
        summary.message = message[:2000]
        return summary, EXIT_FAILED
    finally:
        if watcher is not None:
            watcher.stop()
        trainer.close()
        preemption.restore()


class Trainer:
    def __init__(self, spec: JobSpec, preemption: Preemption, clock: Any = None) -> None:
        from runner.measure import PhaseClock

        self.spec = spec
        self.preemption = preemption
        self.clock: PhaseClock = clock or PhaseClock()  # where the run's time goes, by phase
        self.group: Group | None = None
        self.reporter: Any = None
        self.state = ckpt.TrainState()
        self.resumed_from: str | None = None
        self.output_uri: str | None = None
        self.publish_problem: str | None = None  # the merge failed (the output is saved)
        self.manifest_sha256: str | None = None  # of the newest checkpoint's manifest (its events carry it)
        self.output_manifest_sha256: str | None = None  # of the output's manifest (the terminal event's)
        self.stats: Any = None
        self.max_steps: int | None = None
        self.wandb: Any = None
        self.fsdp = False
        self.session_started = time.time()
        self.session_clock = time.monotonic()  # this run's paid time (CostSpec.paid) counts from here
        self.paid_at_cap: float | None = None  # the spend when the runner last looked at its cap
        self.cap_note: str | None = None  # why it stopped there (the budget event's and the summary's line)
        self.meter: Any = None  # runner/measure.RunMeter: what the planner's calibration learns from
        # The chart's data since the last event: (step, loss, lr) of every step, (step, eval loss) of evals.
        self.points: list[tuple[int, float, float]] = []
        self.evals: list[tuple[int, float]] = []
        # this job's integrity key (runner/contract/integrity.py); None when run by hand
        self.key = key_from_env()
        # Made by setup(), step by step (each step's docstring names what it makes).
        self.model_dir: Path | None = None  # config and tokenizer first, the weights after the checks
        self.target_modules: list[str] | str = spec.lora.target_modules  # as checked against the model
        self.tokenizer: Any = None
        self.data: Any = None  # runner/data.Prepared: train and eval examples
        self.dtype = torch.float32  # what activations are computed in (runner/model.compute_dtype)
        self.autocast = False  # the forward under bf16 autocast (runner/model.precision_for)
        self.precision: Any = None  # runner/model.Precision: weights, compute dtype, autocast, TF32
        self.kernels_problem: str | None = "not loaded"  # why Liger's kernels do not run (None: they do)
        self.eval_every: int | None = None  # evals between the first and the last (contract/steps.eval_every)
        self.pending: Any = None  # runner/readback.PendingLosses: steps whose loss is still on the device
        self.saving: Any = None  # runner/checkpoint.BackgroundSave: the timed save in flight
        self.grow: Any = None  # runner/oom.GrowBack: when a backed-off level is tried again
        self.batches_for: Callable[[Any, int], Any] = _not_set_up
        # runner/contract/steps.RunLength: the run's steps, as the planner priced them
        self.length: Any = None
        self.steps_per_epoch = 0
        self.model: Any = None
        self.trainable_names: set[str] = set()
        self.store: ckpt.CheckpointStore | None = None
        self.ddp_model: Any = None  # the model as trained: wrapped by DDP/FSDP on several processes
        self.params: list[torch.nn.Parameter] = []
        self.head_loss: Any = None  # runner/loss.HeadLoss
        self.checkpointing = spec.gradient_checkpointing
        self.oom_levels: list[Any] = []  # runner/oom.Level: how to retry after an out-of-memory error
        self.oom_level = 0
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.plateau: Any = None  # runner/plateau.PlateauDetector
        # What the money bought (runner/samples.py, RunResults): the result is the best or the last step, the
        # sample prompts both models answer, the best step's weights while training (keep=best), the results.
        self.keep = "last"
        self.sample_prompts: list[Any] = []
        self.best_weights: tuple[str, dict[str, torch.Tensor]] | None = None
        self.results: RunResults | None = None

    # ---- setup: the cheap checks first (data, attention, LoRA targets), then weights, optimizer, resume -

    def setup(self) -> None:
        clock = self.clock
        _import_libraries()  # in the start phase, as a prewarmed process has them (runner/prewarm.py)
        self._join_group()
        with clock.phase("data"):
            records = self._read_dataset()  # 1. before anything is downloaded
        self._check_kernels()
        with clock.phase("load"):
            self._read_config()  # 2. the config and tokenizer (small files), LoRA targets on the meta device
        with clock.phase("data"):
            self._prepare_data(records)
            self._plan_length()
            self._plan_samples()
        strategy = self.spec.strategy(self._group().world)
        self._describe(strategy)
        with clock.phase("load"):
            self._load_weights(strategy)  # 3. the weights
            self._build_step(strategy)  # wrapping, loss, optimizer, scheduler; a verified checkpoint resumed
        clock.carry(self.state.phases)  # a resumed job's earlier runs, up to the checkpoint it resumed
        self._start_plateau()
        self._start_logging()

    def _join_group(self) -> None:
        """The process group and device, the seed, and (main process) the reporter: from here on every
        failure is reported as a `failed` event with its reason."""
        self.group = group = setup(self.spec.gpus)
        torch.manual_seed(self.spec.seed)
        if group.main:
            from runner.report import Reporter

            # The step is the progress its heartbeat reports (runner/contract/heartbeat.py), on its own clock.
            # The bot's stop request (a cloud's only way to tell it to stop) sets the flag SIGTERM sets.
            self.reporter = Reporter(
                self.spec,
                start_seq=_next_seq_in_progress(self.spec),
                activity=lambda: self.state.step,
                on_stop=self.preemption.asked,
            )

    def _read_dataset(self) -> list[Any]:
        """Every record of the dataset, read and checked: an unreadable or empty one is an invalid job."""
        from runner.contract.records import DatasetError, read_records

        spec = self.spec
        try:
            records = list(read_records(spec.dataset.uri, spec.dataset.format))
        except DatasetError as exc:
            raise InvalidJob(str(exc)) from None
        if not records:
            raise InvalidJob(f"{spec.dataset.uri}: dataset is empty: no records to train on")
        return records

    def _check_kernels(self) -> None:
        """The loss and attention kernels the spec asks for exist on this device and image."""
        from runner.model import has_flash_attention

        spec, group = self.spec, self._group()
        # loss=liger and kernels=liger are not refused where Liger cannot run: the run goes on with torch and
        # says why in its log (runner/kernels.py).
        if spec.attn == "flash" and group.device.type == "cuda" and not has_flash_attention():
            raise InvalidJob(
                "attn=flash needs the flash-attn package, which this runner image does not "
                "have; use attn=sdpa, or build the image with FLASH_ATTN=1 "
                "(scripts/runner-image.sh)"
            )

    def _read_config(self) -> None:
        """model_dir (config and tokenizer files only) and target_modules checked against its Linear layers;
        a base model that does not exist or cannot be reached is an invalid job."""
        from runner.model import check_target_modules, linear_module_names, resolve_base_model

        spec = self.spec
        looks_local = spec.base_model.startswith(("/", ".", "~", "file://"))
        if looks_local and not Path(spec.base_model.removeprefix("file://")).expanduser().exists():
            raise InvalidJob(f"base_model {spec.base_model!r} does not exist on this host")
        try:
            self.model_dir = resolve_base_model(spec.base_model, weights=False)
        except FileNotFoundError as exc:
            raise InvalidJob(f"base_model {spec.base_model!r}: {exc}") from None
        except Exception as exc:
            if type(exc).__name__ in (
                "RepositoryNotFoundError",
                "GatedRepoError",
                "RevisionNotFoundError",
                "HFValidationError",
            ):
                raise InvalidJob(f"base_model {spec.base_model!r}: {type(exc).__name__}") from None
            raise  # a network problem may pass: the bot retries a failed run
        if spec.method is not Method.full:
            try:
                self.target_modules = check_target_modules(
                    spec.lora.target_modules, linear_module_names(self.model_dir)
                )
            except ValueError as exc:
                raise InvalidJob(str(exc)) from None

    def _prepare_data(self, records: list[Any]) -> None:
        """tokenizer, data and stats (tokenized, split), dtype and autocast, and batches_for: an epoch's
        micro-batches as a pure function of (seed, epoch)."""
        from runner.contract.records import DatasetError
        from runner.data import make_batches, prepare
        from runner.model import enable_tf32, load_tokenizer, precision_for

        spec, group = self.spec, self._group()
        assert self.model_dir is not None
        self.tokenizer = load_tokenizer(self.model_dir)
        try:
            data = prepare(spec, self.tokenizer, records=records)
        except DatasetError as exc:
            raise InvalidJob(str(exc)) from None
        self.data, self.stats = data, data.stats
        self.precision = precision_for(spec, group.device.type)
        self.dtype, self.autocast = self.precision.compute, self.precision.autocast
        if group.device.type == "cuda" and self.precision.tf32:
            enable_tf32()
        attn = (
            "flash"
            if spec.attn == "flash" and group.device.type == "cuda"
            else ("sdpa" if spec.attn == "flash" else spec.attn)
        )

        def batches(examples: Any, epoch: int) -> Any:
            return make_batches(
                examples,
                seq_len=spec.seq_len,
                micro_batch_size=spec.micro_batch_size,
                packing=spec.packing,
                attn=attn,
                seed=spec.seed,
                epoch=epoch,
                pad_id=self.tokenizer.pad_token_id or 0,
            )

        self.batches_for = batches

    def _plan_length(self) -> None:
        """length, steps_per_epoch and max_steps, from the arithmetic the planner priced the run with
        (runner/contract/steps.py); a dataset too small for one optimizer step is an invalid job."""
        from runner.contract.steps import eval_every, run_length

        spec, group, data = self.spec, self._group(), self.data
        self.length = run_length(
            [len(e) for e in data.train],
            [len(e) for e in data.eval],
            seq_len=spec.seq_len,
            micro_batch_size=spec.micro_batch_size,
            grad_accum=spec.grad_accum,
            processes=group.world,
            packing=spec.packing,
            seed=spec.seed,
            epochs=spec.epochs,
            max_steps=spec.max_steps,
            plateau=spec.plateau,
            keep=spec.keep,
        )
        self.steps_per_epoch = self.length.steps_per_epoch
        if self.steps_per_epoch == 0:
            raise InvalidJob(
                f"the dataset makes {self.length.epoch.micro_batches} micro-batches, fewer than grad_accum x "
                f"processes ({spec.grad_accum} x {group.world}): not one optimizer step; add data or lower "
                "grad_accum"
            )
        self.max_steps = self.length.steps
        # Evals between the base model's and the final one only where something needs them (the plateau
        # stop, keep=best, a cadence set): the rule the planner prices the passes with.
        self.eval_every = eval_every(spec.plateau, self.max_steps, keep=spec.keep, processes=group.world)

    def _plan_samples(self) -> None:
        """keep (what the result will be) and sample_prompts: a prompts file's, read and checked now (a bad
        one is an invalid job, before any weights are fetched), else the first held-out examples'."""
        from runner import samples
        from runner.contract.reading import DatasetError

        spec, group = self.spec, self._group()
        self.keep = "last"
        if self.data.eval and (spec.keep or Defaults.keep_with_eval) == "best":
            if group.distributed:
                if group.main:
                    print("note: keep=best needs a single process; the result is the last step", flush=True)
            else:
                self.keep = "best"
        count = spec.samples.count
        if count == 0:
            return
        if spec.samples.prompts or spec.samples.prompts_uri:
            from runner.contract.prompts import prompts_of, read_prompts

            try:
                if spec.samples.prompts:
                    records = prompts_of(spec.samples.prompts[:count])
                else:
                    records = read_prompts(spec.samples.prompts_uri or "", limit=count)
                self.sample_prompts = samples.from_records(records, self.tokenizer)
            except DatasetError as exc:
                raise InvalidJob(f"prompts: {exc}") from None
            except (ValueError, TypeError) as exc:  # e.g. chat prompts and a tokenizer without a template
                raise InvalidJob(f"prompts: {exc}") from None
        elif self.data.eval:
            self.sample_prompts = samples.from_examples(self.data.eval, self.tokenizer, count)

    def _describe(self, strategy: str) -> None:
        """The run's shape in the log (main process)."""
        spec, group, data = self.spec, self._group(), self.data
        if not group.main:
            return
        tokens_per_step = spec.tokens_per_step * group.world
        print(
            f"records: {self.stats.records} (truncated {self.stats.truncated}, dropped "
            f"{self.stats.dropped}); format {spec.dataset.format.value}; train examples "
            f"{len(data.train)}, eval {len(data.eval)}"
        )
        print(
            f"tokens per step will be: {tokens_per_step:,} (seq_len {spec.seq_len} x micro_batch "
            f"{spec.micro_batch_size} x grad_accum {spec.grad_accum} x processes {group.world})"
        )
        print(f"length: {self.length.describe()}")
        if self.data.eval or self.sample_prompts:
            said = [f"result: the {'best (lowest eval loss)' if self.keep == 'best' else 'last'} step"]
            if self.sample_prompts:
                said.append(
                    f"{len(self.sample_prompts)} sample prompt(s) answered by the base and the tuned model "
                    f"(greedy, at most {spec.samples.max_new_tokens} new tokens)"
                )
            print("; ".join(said))
        mixed = ""
        if self.autocast:
            master = "fp32 master weights" if spec.method is Method.full else "fp32 adapters"
            mixed = f" ({master}, bf16 autocast)"
        print(
            f"steps per epoch: {self.steps_per_epoch}; max steps: {self.max_steps}; "
            f"device {group.device}, dtype {self.dtype}{mixed}, method {spec.method.value}, "
            f"sharding {strategy}",
            flush=True,
        )

    def _load_weights(self, strategy: str) -> None:
        """The weights downloaded into model_dir, model loaded (adapters attached), trainable_names, and the
        checkpoint store."""
        from runner.model import load_model, resolve_base_model, trainable_parameters

        spec, group = self.spec, self._group()
        self.model_dir = resolve_base_model(spec.base_model, weights=True, into=self.model_dir)
        self.model = load_model(
            spec,
            self.model_dir,
            group.device,
            fsdp=strategy == "fsdp",
            target_modules=self.target_modules,
            precision=self.precision,
        )
        from runner.attention import chosen

        if group.main and (choice := chosen()) is not None:
            print(choice.line(), flush=True)
        if spec.kernels == "liger":  # RMSNorm, RoPE, SwiGLU; the loss follows in _loss_for
            from runner.kernels import apply_liger

            self.kernels_problem = apply_liger(self.model, group.device.type)
        else:
            self.kernels_problem = "kernels=torch"
        trainable, total = trainable_parameters(self.model)
        if group.main:
            print(
                f"parameters: {trainable:,} trainable of {total:,} ({100 * trainable / total:.2f}%)",
                flush=True,
            )
        self.trainable_names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        self.store = ckpt.CheckpointStore(spec.checkpoint.uri)

    def _build_step(self, strategy: str) -> None:
        """ddp_model, fsdp, params, head_loss, the out-of-memory levels, optimizer and scheduler; a checkpoint
        whose signed manifest verifies (runner/contract/manifest.py) is loaded into them, others are told."""
        from runner import oom

        spec, group = self.spec, self._group()
        assert self.store is not None
        fetched = self.store.fetch_resume(job_id=spec.job_id, key=self.key, points=spec.resume)  # every rank
        resume_step, resume_dir = fetched.step, fetched.folder
        for skipped in fetched.skipped if group.main else []:
            print(f"note: ignored {skipped}", flush=True)
            self.emit(EventKind.warning, message=f"ignored {skipped}")
        try:
            if resume_dir is not None:
                ckpt.read_weights(resume_dir, self.model)  # before wrapping: plain parameter names
            # FSDP's own mixed precision for fp32 master weights only (adapters keep their fp32 units)
            full_mixed = self.autocast and spec.method is Method.full
            self.ddp_model = wrap(self.model, group, strategy, mixed=full_mixed)
            self.fsdp = type(self.ddp_model).__name__ == "FullyShardedDataParallel"
            self.params = [p for p in self.ddp_model.parameters() if p.requires_grad]
            self.head_loss = self._loss_for(self.batches_for(self.data.train, 0))
            self.checkpointing = spec.gradient_checkpointing
            self.oom_levels = oom.levels(spec.micro_batch_size, spec.gradient_checkpointing)
            self.oom_level = oom.start_level(spec.micro_batch_size, spec.gradient_checkpointing)
            self.grow = oom.GrowBack()
            self._apply_level()
            self.optimizer = self._optimizer()
            self.scheduler = self._scheduler()
            if resume_dir is not None:
                ckpt.read_optimizer(resume_dir, self.ddp_model, self.optimizer, fsdp=self.fsdp)
                self.state = ckpt.read_rest(resume_dir, scheduler=self.scheduler, rank=group.rank)
                self._read_best(resume_dir)
                self._resumed(fetched.uri or self.store.uri_of(resume_step))
        finally:
            if resume_dir is not None:
                shutil.rmtree(resume_dir, ignore_errors=True)

    def _read_best(self, resume_dir: Path) -> None:
        """keep=best: the best step's weights back in memory (its own file, or the checkpoint's weights when
        the best step is the checkpoint's)."""
        state = self.state
        if self.keep != "best" or state.best_step is None:
            return
        from safetensors.torch import load_file

        name = ckpt.weights_name(resume_dir)
        path = resume_dir / ckpt.BEST_FILE
        if not path.exists():
            path = resume_dir / name if name and state.best_step == state.step else None  # type: ignore[assignment]
        if name and path is not None and path.exists():
            self.best_weights = (name, load_file(str(path)))

    def _scheduler(self) -> Any:
        """The learning-rate schedule over max_steps, warming up for warmup_ratio of them."""
        from transformers import get_scheduler

        assert self.max_steps is not None
        return get_scheduler(
            self.spec.lr_scheduler,
            self.optimizer,
            num_warmup_steps=math.ceil(self.spec.warmup_ratio * self.max_steps),
            num_training_steps=self.max_steps,
        )

    def _start_plateau(self) -> None:
        """plateau: the detector, resumed where the checkpoint left it; an eval loss is already a mean over
        the split, so no smoothing on top."""
        from runner.plateau import PlateauDetector

        assert self.max_steps is not None
        plateau = self.spec.plateau.resolved(self.max_steps)
        if self.data.eval:
            plateau = plateau.model_copy(update={"ema": 0.0})
        self.plateau = PlateauDetector(plateau)
        if self.state.plateau:
            self.plateau.load_state_dict(self.state.plateau)

    def _start_logging(self) -> None:
        """Main process: the reporter moved past the resumed events, and W&B (resuming its run)."""
        if not self._group().main:
            return
        from runner.wandb_log import WandbLog

        spec = self.spec
        self.reporter.advance_to(self.state.reporter_seq)
        self.wandb = WandbLog()
        with self.clock.phase("wandb"):  # priced apart (bot/planner/phases.wandb_seconds), not a start-up
            self.state.wandb_run_id = self.wandb.start(
                spec, self.state.wandb_run_id, spec.redacted().model_dump(mode="json")
            )

    def _group(self) -> Group:
        assert self.group is not None, "setup() joins the process group first"
        return self.group

    def _loss_for(self, batches: Any) -> Any:
        """The loss as the spec asks (runner/loss.py): Liger's fused one where Liger's kernels run
        (runner/kernels.py), else the plan's (loss=liger without Liger: chunked, said in the log); checked
        against the model's own logits on a short slice of the first batch: a head that does more than the
        loss knows trains with the plain loss."""
        from runner.kernels import describe
        from runner.loss import HeadLoss, check_against_plain

        assert self.group is not None
        spec = self.spec
        fallback = "chunked" if spec.loss == "liger" else spec.loss
        kind = "liger" if spec.kernels == "liger" and self.kernels_problem is None else fallback
        if self.group.main:
            print(describe(spec.kernels, self.kernels_problem, kind), flush=True)
            if spec.loss == "liger" and kind != "liger":
                print(f"note: loss=liger needs Liger's kernels, which do not run here: {kind}", flush=True)
        head_loss = HeadLoss(self.model, kind, self.model.config)
        if head_loss.kind != "plain" and len(batches):
            problem = check_against_plain(head_loss, self.ddp_model, batches[0], self.group.device)
            if problem:
                head_loss.remove()
                if self.group.main:
                    print(f"note: {problem}; training with the plain loss", flush=True)
        if self.group.main:
            print(f"loss: {head_loss.kind} cross-entropy", flush=True)
        return head_loss

    def _optimizer(self) -> torch.optim.Optimizer:
        spec = self.spec
        assert self.group is not None
        cuda = self.group.device.type == "cuda"
        if spec.optimizer != "adamw":
            if cuda:
                import bitsandbytes as bnb

                paged = spec.optimizer == "paged_adamw_8bit"
                cls = bnb.optim.PagedAdamW8bit if paged else bnb.optim.AdamW8bit
                return cls(self.params, lr=spec.learning_rate, weight_decay=spec.weight_decay)
            if self.group.main:
                print(f"note: {spec.optimizer} needs CUDA; using torch AdamW on the CPU", flush=True)
        # Fused on CUDA by default, as the planner assumes (torch/optim/adam.py _fused_adam updates in place:
        # no step temporaries); "foreach" (torch's own default when fused is not asked for: one temporary the
        # size of the states, _multi_tensor_adam's exp_avg_sq_sqrt) and "for-loop" when the spec asks; the
        # CPU takes torch's default unless the spec names one.
        impl = spec.optimizer_impl
        kinds = {
            "fused": {"fused": True} if cuda else {},
            "foreach": {"foreach": True},
            "for-loop": {"foreach": False},
        }
        return torch.optim.AdamW(
            self.params, lr=spec.learning_rate, weight_decay=spec.weight_decay, **kinds[impl]
        )

    def _resumed(self, uri: str) -> None:
        assert self.group is not None
        self.resumed_from = uri
        if self.state.world_size != self.group.world:
            # The data position is per rank; a different world size sees the epoch in other shares.
            self.state.micro_batch = self.state.micro_batch * self.state.world_size // self.group.world
        if self.group.main:
            print(f"resumed from {self.resumed_from} at step {self.state.step}", flush=True)

    # ---- the loop -------------------------------------------------------------------------------------

    def train(self) -> str:
        spec, group, state = self.spec, self.group, self.state
        assert group is not None and self.max_steps is not None
        resumed = f"resumed from {self.resumed_from}" if self.resumed_from else None
        self.emit(
            EventKind.started,
            message=resumed,
            wandb_url=self.wandb.url if self.wandb is not None else None,
            wandb_note=self._wandb_note(),
        )
        if state.step == 0:
            self._before_training()
        from runner.measure import RunMeter
        from runner.readback import PendingLosses

        self.pending = PendingLosses()
        self.saving = ckpt.BackgroundSave()

        self.meter = RunMeter(group.device, clock=self.clock)
        clock = self.clock
        last_save = last_report = time.monotonic()
        window_tokens, window_start = 0, time.monotonic()
        session_start, session_train_seconds = time.monotonic(), state.train_seconds
        status = "finished"
        if group.all_max([float(self._at_cap())])[0]:  # the set-up alone (a long download) spent it all
            self.cap_note = self._cap_message()
            self.emit(EventKind.budget, message=self.cap_note)
            return "budget"
        from runner.stage import StageGate

        stages = StageGate(spec, self.key)  # a sweep's run pauses at its stage boundaries (runner/stage.py)
        if stages.due(state.step, self.max_steps):  # resumed at one the sweep has not decided yet
            stopped = stages.wait(self)
            if stopped:
                return stopped
        clock.switch("steps")  # batches built and moved between steps count as the steps'
        first = True
        while state.step < self.max_steps:
            epoch_batches = self.batches_for(self.data.train, state.epoch)
            mine = epoch_batches[group.rank :: group.world] if group.distributed else epoch_batches
            # the same on every process (runner/contract/steps.py)
            n_micro = self.steps_per_epoch * spec.grad_accum
            while state.micro_batch + spec.grad_accum <= n_micro and state.step < self.max_steps:
                micro = [mine[i] for i in range(state.micro_batch, state.micro_batch + spec.grad_accum)]
                step_started = time.monotonic()
                with clock.phase("warmup", hold=True) if first else contextlib.nullcontext():
                    loss, tokens = self._step(micro)
                    lr = self.scheduler.get_last_lr()[0]
                    epoch_f = state.epoch + (state.micro_batch + spec.grad_accum) / max(1, n_micro)
                    self.pending.add(state.step + 1, loss, lr, epoch_f, state.tokens_seen + tokens)
                    report_due = group.main and (
                        time.monotonic() - last_report >= spec.report.every_seconds
                        or state.step + 1 == self.max_steps
                    )
                    if report_due:  # the one read-back per report: its wait for the device is the steps'
                        self._read_losses()
                first = False
                step_seconds = time.monotonic() - step_started
                clock.switch("logging")  # the step's bookkeeping, reports and the cap check
                self.meter.step(tokens, step_seconds)
                state.micro_batch += spec.grad_accum
                state.step += 1
                state.tokens_seen += tokens
                window_tokens += tokens
                state.train_seconds = session_train_seconds + time.monotonic() - session_start
                self._grow_back()
                self._announce_saves()  # a background save that finished since the last step
                now = time.monotonic()
                if report_due:
                    rate = window_tokens / max(now - window_start, 1e-9)
                    eta = (self.max_steps - state.step) * (state.train_seconds / max(state.step, 1))
                    print(
                        f"step {state.step}/{self.max_steps} | loss {state.last_loss:.4f} | lr {lr:.2e} | "
                        f"{rate:,.0f} tok/s | epoch {epoch_f:.2f} | eta {eta:.0f}s",
                        flush=True,
                    )
                    self.emit(
                        EventKind.progress,
                        loss=state.last_loss,
                        learning_rate=lr,
                        tokens_per_second=rate,
                        eta_seconds=eta,
                        epoch=epoch_f,
                    )
                    last_report, window_tokens, window_start = now, 0, now

                plateau_stop = self._plateau_says_stop(state.step)
                # a timed save waits while the last one still uploads (never a queue of them)
                due = now - last_save >= spec.checkpoint.every_minutes * 60 and not self.saving.busy
                capped = state.step < self.max_steps and self._at_cap(ahead_s=step_seconds)
                preempted, due, plateau_stop, capped = (
                    bool(v)
                    for v in group.all_max(
                        [float(self.preemption.requested), float(due), float(plateau_stop), float(capped)]
                    )
                )
                if capped and not preempted:  # no bot may be alive to stop it: the runner stops itself
                    with clock.phase("checkpoints"):
                        uri = self.save()
                    self.cap_note = self._cap_message(saved=True)
                    # with its manifest's digest: the bot acknowledges it and a resume with more money goes on
                    # from it (issue 38: without it, the checkpoint saved at the cap was never resumed from)
                    self.emit(
                        EventKind.budget,
                        checkpoint_uri=uri,
                        manifest_sha256=self.manifest_sha256,
                        message=self.cap_note,
                    )
                    return "budget"
                if preempted:
                    with clock.phase("checkpoints"):
                        uri = self.save()
                    self.emit(
                        EventKind.preempted,
                        checkpoint_uri=uri,
                        manifest_sha256=self.manifest_sha256,
                        message=f"{self.preemption.why}: saved and exiting",
                    )
                    return "preempted"
                if plateau_stop:
                    with clock.phase("checkpoints"):
                        uri = self.save()
                    status = "plateau"
                    break
                if due and state.step < self.max_steps:
                    with clock.phase("checkpoints"):  # taken now; written and uploaded in the background
                        self.save(background=True)
                    last_save = time.monotonic()
                if stages.due(state.step, self.max_steps):  # a stage boundary: no step past it unless kept
                    stopped = stages.wait(self)
                    if stopped:
                        return stopped
                    last_report = last_save = time.monotonic()
                clock.switch("steps")
            if status == "plateau":
                break
            if state.step < self.max_steps:
                state.epoch += 1
                state.micro_batch = 0
        clock.switch("logging")
        self._read_losses()
        with clock.phase("checkpoints"):
            self._announce_saves(wait=True)  # the timed save in flight, complete before the output
            if group.main and self.store is not None:  # a killed save's leftover past the last timed save
                self.store.prune(spec.checkpoint.keep, upto=state.step)
        every = self.eval_every or 0
        if self.data.eval and (self.state.eval_loss is None or not every or state.step % every):
            with clock.phase("evals"):
                self._eval_now(state.step)  # the final eval loss, for the model card
        self.results = self._results()
        with clock.phase("output"):
            self.output_uri = self.save_output(status)
        if self.results is not None:
            self.emit(EventKind.results, results=fit_results(self.results))
        kind = EventKind.plateau if status == "plateau" else EventKind.finished
        notes = ["stopped: the loss stopped improving"] if status == "plateau" else []
        if self.publish_problem:
            notes.append(self.publish_problem)
        self.emit(
            kind,
            output_uri=self.output_uri,
            manifest_sha256=self.output_manifest_sha256,
            metrics=self.metrics(),
            message="; ".join(notes) or None,
        )
        return status

    def _before_training(self) -> None:
        """The base model measured once, before the first step: its eval loss and its answers to the sample
        prompts (kept in the trainer state: a resumed run does not measure again)."""
        if self.data.eval:
            with self.clock.phase("base_eval"):
                self._eval_now(0)
        if self.sample_prompts:
            with self.clock.phase("samples"):
                self.state.base_answers = self._answers()
            if self._group().main:
                print(f"samples: the base model answered {len(self.sample_prompts)} prompt(s)", flush=True)

    def _answers(self) -> list[str]:
        from runner import samples

        return samples.answer(
            self.ddp_model,
            self.sample_prompts,
            self.tokenizer,
            device=self._group().device,
            max_new_tokens=self.spec.samples.max_new_tokens,
            precision=self._precision,
            progress=self._touch,  # each token generated: long generation is not idleness
        )

    def _results(self) -> RunResults | None:
        """The result chosen (keep=best: the best step's weights loaded back when it is not the last), the
        tuned model's answers, and what both say against the base model."""
        state, spec = self.state, self.spec
        if not self.data.eval and not self.sample_prompts:
            return None
        best, last_step = state.best_step, state.step
        restored = self.keep == "best" and best not in (None, last_step) and self.best_weights is not None
        if restored:
            assert self.best_weights is not None
            ckpt.apply_weights(self.model, *self.best_weights)
        with self.clock.phase("samples"):
            answers = self._answers() if self.sample_prompts else []
        base = list(state.base_answers) + [""] * (len(answers) - len(state.base_answers))
        result_step = best if restored and best is not None else last_step
        after = state.best_eval_loss if restored else (state.eval_loss if self.data.eval else None)
        why = self._why(restored)
        if self._group().main:
            print(f"result: step {result_step} ({why})", flush=True)
        return RunResults(
            eval_before=state.base_eval_loss,
            eval_after=after,
            last_eval=state.eval_loss if self.data.eval else None,
            evaluations=state.evaluations,
            keep=self.keep,  # type: ignore[arg-type]
            result_step=result_step,
            last_step=last_step,
            why=why[:500],
            samples=[
                Sample(prompt=p.text, base=b, tuned=t, expected=p.expected)
                for p, b, t in zip(self.sample_prompts, base, answers, strict=False)
            ],
            sample_tokens=spec.samples.max_new_tokens if answers else 0,
        )

    def _why(self, restored: bool) -> str:
        """Which step the result is, in words (the card and the thread say it)."""
        state, n = self.state, self.state.evaluations
        if not self.data.eval:
            return "the last step (no eval split to choose by)"
        best, low = state.best_step, state.best_eval_loss
        if self.keep == "best":
            if restored and low is not None and state.eval_loss is not None:
                return (
                    f"keep=best: the lowest eval loss of {n} evaluations, {low:.4f} at step {best}; the last "
                    f"step's ({state.step}) was {state.eval_loss:.4f}"
                )
            return f"keep=best: the last step had the lowest eval loss of {n} evaluations"
        if self.spec.keep != "last" and self._group().distributed:
            return "the last step (keep=best needs a single process)"
        if best is not None and best != state.step and low is not None:
            return f"keep=last: the last step (the lowest eval loss, {low:.4f}, was at step {best})"
        return "keep=last: the last step"

    def _step(self, micro: list[Any]) -> tuple[float, int]:
        """One optimizer step over `grad_accum` micro-batches; returns (mean loss per label token, tokens).

        Out of memory: the same step again at the next back-off level (runner/oom.py), or OutOfMemory."""
        from runner import oom

        while True:
            try:
                return self._accumulate(micro)
            except Exception as exc:
                if not oom.is_out_of_memory(exc):
                    raise
                problem = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            # Outside the except clause: the error's traceback (and the step's tensors it holds) is gone.
            self._back_off(problem)

    def _accumulate(self, micro: list[Any]) -> tuple[torch.Tensor | float, int]:
        """One optimizer step; its mean loss per label token stays on the device (runner/readback.py: read
        back in batches), a float on several processes (summed over them, which syncs anyway)."""
        from runner import oom
        from runner.data.batching import model_inputs

        assert self.group is not None
        group, model, level = self.group, self.ddp_model, self.oom_levels[self.oom_level]
        model.train()
        label_tokens, tokens = group.all_sum(
            [float(sum(b.num_label_tokens for b in micro)), float(sum(b.num_tokens for b in micro))]
        )
        label_tokens = max(label_tokens, 1.0)
        loss_sum: torch.Tensor | None = None
        # Each micro-batch split into level.parts micro-steps: the loss is summed over the same label tokens
        # and divided by the same count, so the gradient is the one of the unsplit step.
        pieces = [piece for batch in micro for piece in oom.split_rows(batch, level.parts)]
        for index, batch in enumerate(pieces):
            inputs, labels, where = model_inputs(batch, group.device)  # sizes worked out on the host
            oom.maybe_inject(labels.numel(), level.checkpointing)
            sync_now = index == len(pieces) - 1
            context = (
                model.no_sync()
                if group.distributed and not sync_now and hasattr(model, "no_sync")
                else contextlib.nullcontext()
            )
            with context:
                with self._precision():  # the forward and the loss; backward runs outside autocast
                    summed = self.head_loss(model, inputs, labels, where)  # runner/loss.py
                # DDP averages gradients over ranks; scaling by world keeps the total a per-token mean.
                (summed * group.world / label_tokens).backward()
            part = summed.detach().double()  # no read-back here: the step's loss is read with others
            loss_sum = part if loss_sum is None else loss_sum + part
            del inputs, labels, where, summed
        with self.clock.phase("optimizer"):
            if self.fsdp:  # the norm over all shards
                model.clip_grad_norm_(MAX_GRAD_NORM)
            else:
                torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        assert loss_sum is not None
        if group.distributed:
            (total,) = group.all_sum([float(loss_sum)])
            return total / label_tokens, int(tokens)
        return loss_sum / label_tokens, int(tokens)

    def _precision(self) -> Any:
        """The forward's precision (runner/model.precision_for): bf16 autocast on CUDA for every method but a
        pure-bf16 or fp32 run, nothing on the CPU."""
        if self.precision is None or self.group is None:
            return contextlib.nullcontext()
        return self.precision.context(self.group.device.type)

    def _back_off(self, problem: str) -> None:
        """After an out-of-memory error: drop the step's partial gradients and move one level on
        (runner/oom.py); OutOfMemory when none is left, or when several processes must restart together (the
        launcher does that)."""
        from runner import oom

        assert self.group is not None
        spec, group = self.spec, self.group
        self.optimizer.zero_grad(set_to_none=True)
        oom.release(group.device)
        current = self.oom_levels[self.oom_level]
        where = current.describe(spec.micro_batch_size, spec.grad_accum)
        if group.distributed or self.oom_level + 1 >= len(self.oom_levels):
            raise oom.OutOfMemory(f"out of GPU memory at {where}: {problem}")
        self.oom_level += 1
        self._apply_level()
        if self.grow is not None:
            self.grow.backed_off()
        now = self.oom_levels[self.oom_level].describe(spec.micro_batch_size, spec.grad_accum)
        message = f"out of GPU memory at {where}; retrying the step at {now} (the same effective batch)"
        print(f"note: {message}", flush=True)
        self.emit(EventKind.progress, message=message)

    def _grow_back(self) -> None:
        """After a good step at a backed-off level: every ``GrowBack.after`` of them, the level above again
        (runner/oom.py), up to the level the run started at."""
        from runner import oom

        if self.grow is None or self._group().distributed:
            return
        lowest = oom.start_level(self.spec.micro_batch_size, self.spec.gradient_checkpointing)
        if not self.grow.step_ok(self.oom_level, lowest):
            return
        spec = self.spec
        was = self.oom_levels[self.oom_level].describe(spec.micro_batch_size, spec.grad_accum)
        self.oom_level -= 1
        self._apply_level()
        now = self.oom_levels[self.oom_level].describe(spec.micro_batch_size, spec.grad_accum)
        print(f"note: {self.grow.after} steps ran at {was}; trying {now} again", flush=True)

    def _apply_level(self) -> None:
        """Activation checkpointing on or off as the current level asks (on: the spec had it off and a
        back-off turned it on; off again: grown back to a level without it)."""
        from runner.model import disable_checkpointing, enable_checkpointing

        level = self.oom_levels[self.oom_level]
        if level.checkpointing and not self.checkpointing:
            enable_checkpointing(self.model)
            self.checkpointing = True
        elif not level.checkpointing and self.checkpointing and not self.spec.gradient_checkpointing:
            disable_checkpointing(self.model)
            self.checkpointing = False

    def _plateau_says_stop(self, step: int) -> bool:
        """Feed the detector: the eval loss every ``eval_every`` steps (evaluated then, also when the detector
        is off but keep=best or a set cadence needs the curve: runner/contract/steps.eval_every), else the
        training losses, read back at the steps where the detector decides (``_read_losses`` feeds them in
        order, so the decisions are those of one call per step)."""
        if self.data.eval:
            if not self.eval_every or step % self.eval_every != 0:
                return False
            with self.clock.phase("evals"):
                loss = self._eval_now(step)
            if not self.spec.plateau.enabled:
                return False
            return bool(self.plateau.update(step, loss))
        if not self.spec.plateau.enabled or not self.plateau.decides_at(step):
            return False
        return self._read_losses()

    def _read_losses(self) -> bool:
        """The pending steps' losses read back in one transfer (runner/readback.py): the chart's points, the
        W&B rows (sent now), the last loss; without an eval split they feed the plateau detector, whose last
        answer is returned (True: stop)."""
        stop = False
        rows = self.pending.read() if self.pending is not None else []
        feed = not self.data.eval and self.spec.plateau.enabled
        for row in rows:
            self.state.last_loss = row.loss
            self.points.append((row.step, row.loss, row.lr))
            if self.wandb is not None:
                self.wandb.log(
                    {
                        "train/loss": row.loss,
                        "train/lr": row.lr,
                        "train/epoch": row.epoch,
                        "train/tokens": row.tokens_seen,
                    },
                    step=row.step,
                )
            if feed:
                stop = bool(self.plateau.update(row.step, row.loss))
        if rows and self.wandb is not None:
            self.wandb.flush()
        return stop

    def _eval_now(self, step: int) -> float:
        """An eval pass: step 0 measures the base model (the "before"); later ones track the best step (and,
        keep=best, keep its weights)."""
        loss = self.evaluate()
        state = self.state
        state.eval_loss = loss
        self.evals.append((step, loss))
        if step == 0:
            state.base_eval_loss = loss
        else:
            state.evaluations += 1
            if state.best_eval_loss is None or loss < state.best_eval_loss:
                state.best_eval_loss, state.best_step = loss, step
                if self.keep == "best":  # a copy: on the CPU checkpoint_weights' tensors are the live ones
                    name, tensors = ckpt.checkpoint_weights(
                        self.model, self.ddp_model, fsdp=self.fsdp, trainable_names=self.trainable_names
                    )
                    self.best_weights = (name, {k: v.clone() for k, v in tensors.items()})
        if self.group is not None and self.group.main:
            base = " (the base model, before training)" if step == 0 else ""
            print(f"eval loss {loss:.4f} at step {step}{base}", flush=True)
        if self.wandb is not None:
            self.wandb.log({"eval/loss": loss}, step=step)
        return loss

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per label token over the eval split (every rank computes it; the split is small)."""
        assert self.group is not None
        self.ddp_model.eval()
        from runner.data.batching import model_inputs

        total: torch.Tensor | float = 0.0
        count = 0
        for batch in self.batches_for(self.data.eval, 0):
            inputs, labels, where = model_inputs(batch, self.group.device)
            with self._precision():
                total = total + self.head_loss(self.ddp_model, inputs, labels, where).detach().double()
            count += batch.num_label_tokens
            self._touch()  # a long eval is progress: its heartbeat says so (not idle)
        self.ddp_model.train()
        return float(total) / max(count, 1)  # one read-back per pass

    # ---- saving -----------------------------------------------------------------------------------------

    def _touch(self) -> None:
        """Progress that is neither a step nor an event (an eval batch, a token of a sample, bytes of a save
        moving): the next heartbeat says the runner just made progress (runner/report.Reporter.touch)."""
        if self.reporter is not None:
            self.reporter.touch()

    def save(self, *, background: bool = False) -> str:
        """Write a checkpoint (rank 0 writes, every rank takes part) and prune old ones; return its URI.

        What training could still change is taken now (copied to host memory for a background save); the
        files are written, hashed into the signed manifest and uploaded either before this returns (a save
        the run must have before it exits: preemption, the spend cap, a plateau stop) or, ``background``,
        by a thread while training goes on (runner/checkpoint.BackgroundSave): the loop announces it once it
        is complete (``_announce_saves``). One save at a time: the one in flight is finished first."""
        assert self.group is not None
        group = self.group
        self._announce_saves(wait=True)
        self._read_losses()  # the checkpoint's state has the last step's loss
        self.state.plateau = self.plateau.state_dict()
        self.state.world_size = group.world
        self.state.phases = self.clock.seconds()  # the job's phases so far: a resumed run goes on from them
        if self.reporter is not None:
            # +1: the event that announces this checkpoint (checkpoint, preempted, plateau) comes right after
            # it, so a run resumed from it must not reuse that event's seq.
            self.state.reporter_seq = self.reporter.seq + 1
        rngs = group.gather_objects(ckpt.rng_state())
        step = self.state.step
        uri = self.store.uri_of(step)
        weights = optim = None
        if group.main or self.fsdp:  # FSDP gathers the full state collectively
            weights = ckpt.checkpoint_weights(
                self.model, self.ddp_model, fsdp=self.fsdp, trainable_names=self.trainable_names
            )
            optim = ckpt.optimizer_state(self.ddp_model, self.optimizer, fsdp=self.fsdp)
        if group.main:
            assert weights is not None and optim is not None
            staged = Path(tempfile.mkdtemp(prefix="tunebot-ckpt-")) / f"checkpoint-{step}"
            # Every checkpoint is also a result people can load (a stopped job's is all there is): its small
            # files (configs, tokenizer, an unwrapped adapter) are written now, from the live model.
            loadable.add_loadable_files(
                staged,
                self.model,
                self.tokenizer,
                trainable=weights[1] if self.fsdp else None,
                base_name=self.spec.base_model_name,
            )
            moved = ckpt.Moved()  # the save's bytes moving: progress for the heartbeat while it is waited on
            moved.watch(staged)
            keep = ckpt.to_host if background else (lambda value: value)
            files = dict(
                weights=keep(weights),
                optimizer_state=keep(optim),
                scheduler=keep(self.scheduler.state_dict()),
                state=ckpt.TrainState.from_dict(copy.deepcopy(dataclasses.asdict(self.state))),
                rng_states=rngs,
                spec_json=self.spec.redacted().model_dump_json(indent=2),
            )
            best = None  # keep=best: the best step's weights (cloned when taken: never changed since)
            if self.best_weights is not None and self.state.best_step not in (None, step):
                best = self.best_weights[1]

            def write() -> tuple[str, str, int]:
                return self._write_checkpoint(staged, step, files, best, moved)

            if background:
                self.saving.start(write, moved=moved)
            else:  # by a thread too, so that the wait for it (a long upload on the way out) is progress
                uri, self.manifest_sha256, _ = ckpt.wait_on(write, moved=moved, touch=self._touch)
        group.barrier()
        return uri

    def _write_checkpoint(
        self,
        staged: Path,
        step: int,
        files: dict[str, Any],
        best: dict[str, torch.Tensor] | None,
        moved: ckpt.Moved | None = None,
    ) -> tuple[str, str, int]:
        """Write, sign, upload and prune one staged checkpoint: (its URI, its manifest's digest, its step)."""
        try:
            ckpt.write_local(staged, **files)
            if best is not None:
                from safetensors.torch import save_file

                save_file(best, str(staged / ckpt.BEST_FILE))
            written = manifest.write(staged, job_id=self.spec.job_id, step=step, key=self.key)
            # The event announcing this checkpoint carries its manifest's digest: the bot pins it for a later
            # run's resume (runner/contract/manifest.py fetch_pinned).
            digest = manifest.sha256_of(written.read_bytes())
            assert self.store is not None
            uri = self.store.upload(staged, step, moved=moved)
            self.store.prune(self.spec.checkpoint.keep, upto=step)
        finally:
            shutil.rmtree(staged.parent, ignore_errors=True)
        print(f"checkpoint saved: {uri}", flush=True)
        return uri, digest, step

    def _announce_saves(self, *, wait: bool = False) -> None:
        """A background save that is complete announced (a `checkpoint` event with its manifest's digest);
        ``wait``: the one in flight waited for first. A failed one raises here, in the loop."""
        if self.saving is None or not self.saving.busy:
            return
        if wait:
            done, result = True, self.saving.wait(self._touch)
        else:
            done, result = self.saving.done()
        if done and result is not None:  # the event names the checkpoint's own step, not the loop's
            uri, self.manifest_sha256, step = result
            digest = self.manifest_sha256
            self.emit(EventKind.checkpoint, step=step, checkpoint_uri=uri, manifest_sha256=digest)

    def save_output(self, status: str) -> str:
        """Final adapter (or model) + tokenizer + training_summary.json + job.json, uploaded to output_uri."""
        assert self.group is not None
        uri = self.spec.output_uri.rstrip("/")
        full_state = None
        if self.fsdp:  # every rank takes part in gathering the full weights
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            full_state = get_model_state_dict(self.ddp_model, options=ckpt.full_state_options())
        if self.group.main:
            # Written and uploaded by a thread that this one waits for: its bytes moving (the weights written,
            # a merged model, each file uploaded) are progress for the heartbeat, not idleness (issue 38).
            moved = ckpt.Moved()
            ckpt.wait_on(
                lambda: self._write_output(uri, status, full_state, moved), moved=moved, touch=self._touch
            )
            print(f"output saved: {uri}", flush=True)
        self.group.barrier()
        return uri

    def _write_output(self, uri: str, status: str, full_state: Any, moved: ckpt.Moved) -> None:
        """The output folder built locally (``moved`` watches it) and uploaded file by file, manifest last."""
        import fsspec

        from runner import outputs
        from runner.contract.publish import as_ran
        from runner.model import save_final

        with tempfile.TemporaryDirectory(prefix="tunebot-output-") as tmp:
            local = Path(tmp)
            moved.watch(local)
            save_final(
                self.model,
                self.tokenizer,
                local,
                state_dict=full_state,
                dtype=torch.bfloat16 if self.autocast and self.spec.method is Method.full else None,
            )
            loadable.point_adapter_at(local, self.spec.base_model_name)
            cost = self._cost()
            summary = {
                "status": status,
                "steps": self.state.step,
                "max_steps": self.max_steps,
                "tokens": self.state.tokens_seen,
                "final_loss": self.state.last_loss,
                "eval_loss": self.state.eval_loss,
                "train_seconds": self.state.train_seconds,
                "resumed_from": self.resumed_from,
                "cost": cost,
                "data": self.stats.as_dict() if self.stats is not None else None,
                "method": self.spec.method.value,
                "job_id": self.spec.job_id,
                "results": self.results.model_dump(mode="json") if self.results is not None else None,
            }
            (local / "training_summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
            # no report token in outputs; the precision and sharding that ran, not only those asked for
            ran = as_ran(json.loads(self.spec.redacted().model_dump_json()), self._ran())
            (local / "job.json").write_text(json.dumps(ran, indent=2), encoding="utf-8")
            card = outputs.model_card(
                self.spec,
                status=status,
                steps=self.state.step,
                max_steps=self.max_steps,
                final_loss=self.state.last_loss,
                eval_loss=self.state.eval_loss,
                tokens=self.state.tokens_seen,
                train_seconds=self.state.train_seconds,
                data=summary["data"],
                cost=cost,
                model_dir=self.model_dir,
                ran=self._ran(),
                results=self.results,
            )
            (local / "README.md").write_text(card, encoding="utf-8")
            if self.spec.merge and self.spec.method is not Method.full:
                try:
                    outputs.merge_adapter(local, self.model_dir, local / "merged", dtype=self.dtype)
                    print(f"merged model saved: {uri}/merged", flush=True)
                except Exception as exc:  # the adapter is saved either way
                    self.publish_problem = f"merge failed ({type(exc).__name__}: {exc})"[:500]
                    print(f"note: {self.publish_problem}", flush=True)
            # No push from here: the host holds no Hub token that can write. The bot pushes this folder
            # with its own token once it has checked every file against the manifest below, signed with
            # this run's key and written last (bot/engine/outcome/hub_push.py).
            signed = manifest.build_output(
                local, job_id=self.spec.job_id, run_id=self.spec.run_id, key=self.key
            )
            body = json.dumps(signed, indent=1).encode()
            self.output_manifest_sha256 = manifest.sha256_of(body)
            fs, root = fsspec.core.url_to_fs(uri)
            fs.makedirs(root, exist_ok=True)
            for path in sorted(local.rglob("*")):
                if path.is_file():
                    target = f"{root}/{path.relative_to(local).as_posix()}"
                    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                    moved.put_file(fs, str(path), target)
            fs.pipe_file(f"{root}/{manifest.OUTPUT_MANIFEST}", body)

    def _ran(self) -> dict[str, Any]:
        """What this run really trained with (a CPU run is fp32 in one process or gloo DDP, whatever the
        spec's bf16 and FSDP defaults for GPUs): job.json and the model card say this."""
        assert self.group is not None
        precision = self.precision.name if self.precision is not None else "fp32"
        sharding = "none"
        if self.group.distributed:
            sharding = "fsdp" if self.fsdp else "ddp"
        from runner.attention import NAME, chosen

        attention = (
            getattr(getattr(self.model, "config", None), "_attn_implementation", None) or self.spec.attn
        )
        choice = chosen()
        if attention == NAME and choice is not None and choice.kernel is not None:
            attention = f"packed rows through {choice.kernel.name}"
        liger = self.kernels_problem is None
        return {
            "device": self.group.device.type if self.group.device is not None else "cpu",
            "processes": self.group.world,
            "precision": precision,
            "sharding": sharding,
            "attention": attention,
            "kernels": "Liger" if liger else f"torch ({self.kernels_problem})",
        }

    def _at_cap(self, ahead_s: float = 0.0) -> bool:
        """Whether the job's paid time, with one more step, reaches its spend cap (JobSpec.cost.max_cost):
        priced as the bot's ledger prices it (runner.contract.spec.billed_cost, at the locked price)."""
        cost = self.spec.cost
        if cost.max_cost is None:
            return False
        paid = cost.paid(self.session_started, time.monotonic() - self.session_clock)
        self.paid_at_cap = paid
        return paid is not None and paid + billed_cost(ahead_s, cost.price_per_hour or 0.0) >= cost.max_cost

    def _cap_message(self, saved: bool = False) -> str:
        """Why the runner stopped, with the spend when it decided to (``self.paid_at_cap``)."""
        cost = self.spec.cost
        paid = self.paid_at_cap or 0.0
        step = self.state.step
        where = f"checkpoint saved at step {step}" if saved else f"stopped at step {step}"
        return (
            f"stopped at the spend cap: ${paid:.4f} of max ${cost.max_cost or 0:.4f} at "
            f"${cost.price_per_hour or 0:.4f}/h; {where}"
        )

    def _cost(self) -> float | None:
        """The job's spend so far at its locked prices: earlier instances (from the bot) + this one."""
        price = self.spec.cost.price_per_hour
        if price is None:
            return None
        return round(self.spec.cost.spent_before + (time.time() - self.session_started) * price / 3600, 6)

    # ---- reporting and the summary ---------------------------------------------------------------------

    def emit(self, kind: EventKind, **fields: Any) -> None:
        if self.reporter is None:
            return
        fields.setdefault("step", self.state.step)
        fields.setdefault("max_steps", self.max_steps)
        if kind in _WITH_PHASES:
            fields.setdefault("phases", self.clock.seconds())
        fields.setdefault("tokens_seen", self.state.tokens_seen)
        if self.state.last_loss is not None:
            fields.setdefault("loss", self.state.last_loss)
        chart = kind is not EventKind.results  # a results event is big already: the chart's data waits
        if self.points and chart:  # every step since the last event rides along (the chart's data)
            fields.setdefault("points", thin_points(self.points))
            self.points = []
        if self.evals and chart:
            fields.setdefault("evals", thin_points(self.evals))
            self.evals = []
        try:
            self.reporter.emit(kind, **fields)
        except Exception as exc:  # reporting must never stop training
            print(f"note: could not report {kind.value} ({type(exc).__name__}: {exc})", flush=True)

    def summary(self, status: str, started: float) -> RunSummary:
        return RunSummary(
            status=status,  # type: ignore[arg-type]
            steps=self.state.step,
            max_steps=self.max_steps,
            tokens=self.state.tokens_seen,
            final_loss=self.state.last_loss,
            wall_seconds=round(time.time() - started, 3),
            resumed_from=self.resumed_from,
            output_uri=self.output_uri,
            records_truncated=self.stats.truncated if self.stats is not None else 0,
            records_dropped=self.stats.dropped if self.stats is not None else 0,
            metrics=self.metrics(),
            phases=self.clock.seconds(),
        )

    def _wandb_note(self) -> str | None:
        """What the thread should know about W&B: it did not answer, so this run logs offline (and where)."""
        if self.wandb is None or not self.wandb.note:
            return None
        from runner.wandb_log import sync_hint

        return f"{self.wandb.note}; {sync_hint(self.spec.checkpoint.uri)}"

    def metrics(self) -> dict[str, float | None] | None:
        """What this run measured (runner/measure.py) and the configuration it measured it at: after an
        out-of-memory back-off that is not the spec's (the calibration records the one that ran)."""
        if self.meter is None:
            return None
        out = self.meter.result()
        levels = self.oom_levels
        if levels:
            level = levels[self.oom_level]
            out["micro_batch_size"] = float(max(1, self.spec.micro_batch_size // level.parts))
            out["grad_accum"] = float(self.spec.grad_accum * level.parts)
            out["gradient_checkpointing"] = 1.0 if level.checkpointing else 0.0
        return out

    def close(self) -> None:
        if self.saving is not None and self.saving.busy:  # a run ending early: its save still completes
            try:
                self.saving.wait(self._touch)
            except Exception as exc:  # noqa: BLE001 - the run's own end says what went wrong
                print(f"note: the checkpoint being saved failed ({type(exc).__name__}: {exc})", flush=True)
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb.save_offline(self.spec.checkpoint.uri)  # offline runs outlive the instance
        if self.reporter is not None:
            self.reporter.close()
        if self.group is not None:
            self.group.close()


# The reports that carry the job's phases so far: progress and every end (not started, warnings, results).
_WITH_PHASES = frozenset(
    {
        EventKind.progress,
        EventKind.checkpoint,
        EventKind.preempted,
        EventKind.budget,
        EventKind.out_of_memory,
        EventKind.failed,
        EventKind.plateau,
        EventKind.finished,
    }
)


def _cpu_threads(spec: JobSpec) -> None:
    """On the CPU, the threads the local provider gives this run as its share of the cores
    (bot/providers/local.py thread_share): fewer threads than cores when other runs use them."""
    threads = os.environ.get("TUNEBOT_CPU_THREADS", "")
    if spec.gpus == 0 and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _import_libraries() -> None:
    """The training libraries imported now, where the run's time is counted as its start (imports)."""
    import importlib

    from runner.prewarm import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)


def _not_set_up(examples: Any, epoch: int) -> Any:
    raise RuntimeError("Trainer.setup() makes the batches")


def _next_seq_in_progress(spec: JobSpec) -> int:
    """After the newest checkpoint's seq, the progress object may know later events (a SIGKILL after them);
    only events signed with this job's key count (runner/report.py)."""
    from runner.report import next_seq_in_progress

    return next_seq_in_progress(spec)
