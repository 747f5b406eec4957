"""Checkpoints that survive being killed at any moment, synced to any fsspec URI.

Layout under the checkpoint URI (a folder, s3://bucket/prefix, memory://..., any fsspec URI):

    <uri>/checkpoint-<step>/
        adapter_model.safetensors | model.safetensors   trainable weights (adapter for LoRA/QLoRA)
        | trainable.safetensors                          (FSDP LoRA: trainable parameters by name)
        adapter_config.json | config.json, tokenizer     what makes the folder loadable by peft /
                                                         transformers on its own (runner/loadable.py)
        optimizer.pt  scheduler.pt                       torch state dicts
        rng_state_<rank>.pth                             python, numpy, torch and CUDA RNG per rank
        trainer_state.json                               step, data position, tokens, plateau, seq, W&B id
        job.json                                         the spec the checkpoint was made with
        manifest.json                                    names, sizes, SHA-256, signed
        (runner/contract/manifest.py) COMPLETE                                         written LAST: only a
        checkpoint with it is used
    <uri>/progress.json                                  written by runner.report (latest RunnerEvent)

A checkpoint is written to a local staging folder first, then uploaded file by file with COMPLETE last. The
timed saves of a run write and upload in the background (``BackgroundSave``: what they hold is copied to host
memory first, so training goes on while the files are written, hashed and uploaded); a save that must be
complete before the runner exits (preemption, the spend cap, a plateau stop) waits for it. While the
loop waits on a save, the save's bytes moving (``Moved``) are progress for the runner's heartbeat
(``BackgroundSave.wait``): a long upload is not idleness, a hung one is.
The previous complete checkpoint stays until the new one has its marker; then the oldest are pruned to
`keep`, and incomplete leftovers of killed saves are removed.

A resume loads nothing that can run code: weights from safetensors, metadata from JSON, optimizer,
scheduler and RNG states with ``torch.load(weights_only=True)`` (tensors and plain containers only), and
only after the checkpoint's signed manifest verified every file (``fetch_verified``).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import fsspec.callbacks
import numpy as np
import torch

from runner import credentials
from runner.contract import manifest

MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
ADAPTER_FILE = "adapter_model.safetensors"
MODEL_FILE = "model.safetensors"
TRAINABLE_FILE = "trainable.safetensors"  # under FSDP: every trainable parameter by its unwrapped name
# keep=best: the weights of the step with the lowest eval loss so far, when that is not this checkpoint's step
# (the same tensors as the weights file, runner/train.py); listed in the signed manifest like every file.
BEST_FILE = "best.safetensors"
_DIR_RE = re.compile(r"checkpoint-(\d+)$")
# Test hook: SIGKILL this process after the first file of the Nth checkpoint upload (1-based).
KILL_DURING_SAVE_ENV = "TUNEBOT_TEST_KILL_DURING_SAVE"


@dataclass
class TrainState:
    """Everything besides tensors that a resumed run needs to continue exactly."""

    step: int = 0
    epoch: int = 0
    micro_batch: int = 0  # index of the next micro-batch within `epoch` (this rank's share)
    tokens_seen: int = 0
    last_loss: float | None = None
    eval_loss: float | None = None  # the latest loss on the eval split (None without one)
    reporter_seq: int = 0
    wandb_run_id: str | None = None
    plateau: dict[str, Any] = field(default_factory=dict)
    train_seconds: float = 0.0  # time spent training before this checkpoint, across resumes
    world_size: int = 1
    # What the result is measured against (runner/train.py): the base model's eval loss before the first step,
    # the lowest eval loss since and its step, the eval passes after step 0, the base model's answers.
    base_eval_loss: float | None = None
    best_eval_loss: float | None = None
    best_step: int | None = None
    evaluations: int = 0
    base_answers: list[str] = field(default_factory=list)
    # Where the job's time went up to this checkpoint, by phase (runner/measure.PhaseClock): a resumed run
    # adds its own, so the job's phases add up across runs.
    phases: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain values (so it loads with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies, keeping one name per storage (tied embeddings); safetensors refuses shared tensors."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen and tensor.device.type != "meta":
            continue
        seen.add(key)
        out[name] = tensor.detach().cpu().contiguous()
    return out


def full_state_options() -> Any:
    """Gather full (unsharded) FSDP state; offloaded to CPU on GPUs. On CPU/gloo, cpu_offload breaks the
    unsharded views (torch 2.13: "setStorage ... out of bounds"), and the tensors are on the CPU anyway."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    on_gpu = torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl"
    return StateDictOptions(full_state_dict=True, cpu_offload=on_gpu)


def checkpoint_weights(
    model: Any, wrapped: Any, *, fsdp: bool, trainable_names: set[str]
) -> tuple[str, dict[str, torch.Tensor]]:
    """(file name, tensors) of the weights a checkpoint keeps. Under FSDP every rank must call this."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        full = get_model_state_dict(wrapped, options=full_state_options())
        # A full fine-tune's trainable weights are the whole model: model.safetensors, loadable as it is.
        name = TRAINABLE_FILE if _is_peft(model) else MODEL_FILE
        return name, _unshared({k: v for k, v in full.items() if k in trainable_names})
    if _is_peft(model):
        from peft import get_peft_model_state_dict

        return ADAPTER_FILE, _unshared(get_peft_model_state_dict(model))
    return MODEL_FILE, _unshared(model.state_dict())


def optimizer_state(wrapped: Any, optimizer: torch.optim.Optimizer, *, fsdp: bool) -> dict[str, Any]:
    """The optimizer's state; under FSDP gathered by parameter name (every rank must call this)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(wrapped, optimizer, options=full_state_options())
    return optimizer.state_dict()


def write_local(
    out_dir: Path,
    *,
    weights: tuple[str, dict[str, torch.Tensor]],
    optimizer_state: dict[str, Any],
    scheduler: Any,
    state: TrainState,
    rng_states: list[dict[str, Any]],
    spec_json: str,
) -> None:
    """Write one checkpoint into a local folder (no marker: the upload adds it last). ``scheduler``: the
    scheduler, or its state dict already taken (a save in the background writes what was copied)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    name, tensors = weights
    save_file(tensors, str(out_dir / name))
    torch.save(optimizer_state, out_dir / "optimizer.pt")
    torch.save(scheduler if isinstance(scheduler, dict) else scheduler.state_dict(), out_dir / "scheduler.pt")
    for rank, rng in enumerate(rng_states):
        torch.save(rng, out_dir / f"rng_state_{rank}.pth")
    (out_dir / STATE_FILE).write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    (out_dir / "job.json").write_text(spec_json, encoding="utf-8")


def to_host(value: Any) -> Any:
    """A copy of ``value`` in host memory that training can no longer change: every tensor copied to the CPU
    (a CPU tensor cloned: on the CPU a state dict's tensors are the live ones), containers rebuilt, the rest
    as is. What a checkpoint written in the background writes."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    return value


# How often a wait on a save looks whether the save moved bytes (and then touches the heartbeat's progress).
WAIT_ROUND_S = 1.0


class Moved:
    """How far a save has got, in bytes moved: the sizes of the files in the local folders it writes
    (``watch``: a safetensors file grows as it is written) plus what its uploads sent (``put_file``: per
    block or part where the filesystem reports them, as the generic fsspec one and s3fs do; else per file).
    Read from the waiting thread while the save's thread writes: ``reading`` changes only while the save gets
    somewhere (hashing the files for the manifest moves nothing: at disk speed, minutes for the largest
    model)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent = 0
        self._folders: list[Path] = []

    def watch(self, folder: Path) -> None:
        with self._lock:
            self._folders.append(folder)

    def add(self, count: int) -> None:
        with self._lock:
            self._sent += max(0, int(count))

    def put_file(self, fs: Any, local: str, remote: str) -> None:
        """``fs.put_file`` counted: per block when the filesystem reports them, else the whole file after."""
        callback = _Counted(self)
        fs.put_file(local, remote, callback=callback)
        self.add(os.path.getsize(local) - callback.counted)

    def reading(self) -> int:
        """The bytes moved so far (a few stat calls: the watched folders hold a handful of files)."""
        with self._lock:
            total, folders = self._sent, list(self._folders)
        for folder in folders:
            for parent, _dirs, names in os.walk(folder):
                for name in names:
                    try:
                        total += os.stat(os.path.join(parent, name)).st_size
                    except OSError:  # removed meanwhile (the staging folder once uploaded)
                        continue
        return total


class _Counted(fsspec.callbacks.Callback):
    """An fsspec transfer callback: what the transfer reports (relative or absolute) added to a ``Moved``."""

    def __init__(self, moved: Moved) -> None:
        super().__init__()
        self._moved = moved
        self.counted = 0

    def call(self, hook_name: str | None = None, **kwargs: Any) -> None:
        gained = int(self.value or 0) - self.counted
        if gained > 0:
            self.counted += gained
            self._moved.add(gained)
        super().call(hook_name, **kwargs)


class BackgroundSave:
    """Checkpoint writes and uploads off the training loop, one at a time.

    The loop copies what a checkpoint holds to host memory (``to_host``) and hands the rest - writing the
    files twice over (safetensors, torch.save), hashing them for the manifest, uploading, pruning - to a
    thread. The next save, and the run's end, wait for the one in flight (``wait``); the loop asks between
    steps whether it is done (``done``) to announce it. A failure in the thread is raised in the loop at the
    next ``wait`` or ``done``, as a failed save always stopped the run."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._moved: Moved | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None

    def start(self, work: Callable[[], Any], *, moved: Moved | None = None) -> None:
        """Run ``work`` in the background once the save in flight (if any) is done. ``moved``: what the work
        reports of its bytes moved (``wait`` counts them as progress)."""
        self.wait()
        self._moved = moved

        def run() -> None:
            try:
                self._result = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised there
                self._error = exc

        self._result, self._error = None, None
        self._thread = threading.Thread(target=run, name="tunebot-checkpoint", daemon=True)
        self._thread.start()

    def done(self) -> tuple[bool, Any]:
        """(True, the work's result) once the save in flight finished (then forgotten), else (False, None)."""
        if self._thread is None or self._thread.is_alive():
            return False, None
        return True, self.wait()

    def wait(self, touch: Callable[[], object] | None = None, *, every: float | None = None) -> Any:
        """Wait for the save in flight; its result (None when there was none), its error raised.

        ``touch`` (the reporter's): called every ``every`` seconds of the wait in which the save's thread is
        alive AND moved bytes since the last look (``Moved``), so the heartbeat says the runner made progress
        and a long checkpoint upload is not stopped as idle (issue 38). Not merely while the thread lives: a
        save hung on a dead connection moves nothing, and its runner must still look idle to the bot, which
        stops it (a save without ``moved`` never touches)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        moved, self._moved = self._moved, None
        last = moved.reading() if moved is not None else 0
        every = WAIT_ROUND_S if every is None else every
        while thread.is_alive():
            thread.join(every)
            if touch is not None and moved is not None and thread.is_alive():
                now = moved.reading()
                if now != last:
                    last = now
                    touch()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._result


def wait_on(work: Callable[[], Any], *, moved: Moved, touch: Callable[[], object] | None) -> Any:
    """Do ``work`` (a save the run waits for: on the way out, the output) in a thread and wait for it as for a
    background save (``BackgroundSave.wait``): its bytes moving are the runner's progress; its result, or its
    error raised here."""
    saving = BackgroundSave()
    saving.start(work, moved=moved)
    return saving.wait(touch)


def weights_name(ckpt_dir: Path) -> str | None:
    """The weights file of a checkpoint folder (adapter, trainable or whole model), None when none is."""
    return next((n for n in (ADAPTER_FILE, TRAINABLE_FILE, MODEL_FILE) if (ckpt_dir / n).exists()), None)


def apply_weights(model: Any, name: str, tensors: dict[str, torch.Tensor]) -> None:
    """Load weights as ``checkpoint_weights`` returned them (its file name says how) into the bare model."""
    if name == ADAPTER_FILE:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, tensors)
    else:
        model.load_state_dict(tensors, strict=False)


def read_weights(ckpt_dir: Path, model: Any) -> None:
    """Load a checkpoint's weights into the (not yet wrapped) model."""
    from safetensors.torch import load_file

    if (ckpt_dir / ADAPTER_FILE).exists():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(str(ckpt_dir / ADAPTER_FILE)))
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    else:
        name = TRAINABLE_FILE if (ckpt_dir / TRAINABLE_FILE).exists() else MODEL_FILE
        unexpected = model.load_state_dict(load_file(str(ckpt_dir / name)), strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"checkpoint {ckpt_dir.name} does not fit this model: {unexpected[:5]}")


def read_optimizer(ckpt_dir: Path, wrapped: Any, optimizer: torch.optim.Optimizer, *, fsdp: bool) -> None:
    saved = torch.load(ckpt_dir / "optimizer.pt", weights_only=True)  # tensors and containers only
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            wrapped, optimizer, optim_state_dict=saved, options=StateDictOptions(full_state_dict=True)
        )
    else:
        optimizer.load_state_dict(saved)


def read_rest(ckpt_dir: Path, *, scheduler: Any, rank: int = 0) -> TrainState:
    """Scheduler, this rank's RNG and the trainer state."""
    scheduler.load_state_dict(torch.load(ckpt_dir / "scheduler.pt", weights_only=True))
    rng_path = ckpt_dir / f"rng_state_{rank}.pth"
    if not rng_path.exists():  # resumed with more processes than saved it: share rank 0's stream
        rng_path = ckpt_dir / "rng_state_0.pth"
    set_rng_state(torch.load(rng_path, weights_only=True))
    return TrainState.from_dict(json.loads((ckpt_dir / STATE_FILE).read_text(encoding="utf-8")))


def _read_at(uri: str, name: str, limit: int) -> bytes | None:
    """A small file of the checkpoint at ``uri`` (at most ``limit`` bytes read), None when it is not there."""
    fs, root = fsspec.core.url_to_fs(uri.rstrip("/"))
    try:
        with fs.open(f"{root.rstrip('/')}/{name}", "rb") as fh:
            return fh.read(limit)
    except (FileNotFoundError, IsADirectoryError):
        return None


def _download_at(uri: str, name: str, into: Path, size: int) -> None:
    """One file of the checkpoint at ``uri``, only when it has the size its manifest says."""
    fs, root = fsspec.core.url_to_fs(uri.rstrip("/"))
    remote = f"{root.rstrip('/')}/{name}"
    try:
        found = fs.size(remote)
    except FileNotFoundError:
        raise manifest.ManifestError(f"{name} is missing") from None
    if found != size:
        raise manifest.ManifestError(f"{name} has {found} bytes, the manifest says {size}")
    fs.get_file(remote, str(into))


class CheckpointStore:
    """The checkpoint URI: list complete checkpoints, upload with the marker last, download, prune."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self._fs, root = fsspec.core.url_to_fs(self.uri)
        self._generation = credentials.generation
        self.root = root.rstrip("/")
        self._uploads = 0

    @property
    def fs(self) -> Any:
        """The store's filesystem, made again after renewed storage credentials (runner/credentials.py)."""
        if self._generation != credentials.generation:
            self._fs, _ = fsspec.core.url_to_fs(self.uri)
            self._generation = credentials.generation
        return self._fs

    def uri_of(self, step: int) -> str:
        return f"{self.uri}/checkpoint-{step}"

    def _path(self, step: int) -> str:
        return f"{self.root}/checkpoint-{step}"

    def _listed(self) -> dict[int, bool]:
        """{step: complete?} of every checkpoint folder under the URI."""
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return {}
        found: dict[int, bool] = {}
        markers = {p.rstrip("/") for p in self.fs.glob(f"{self.root}/checkpoint-*/{MARKER}")}
        for entry in entries:
            match = _DIR_RE.search(entry.rstrip("/"))
            if match:
                step = int(match.group(1))
                found[step] = f"{self._path(step)}/{MARKER}" in markers or any(
                    m.endswith(f"checkpoint-{step}/{MARKER}") for m in markers
                )
        return found

    def complete_steps(self) -> list[int]:
        return sorted(step for step, complete in self._listed().items() if complete)

    def newest_complete(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def download(self, step: int, local_dir: Path) -> Path:
        """Every plain file of a checkpoint (a checkpoint written before manifests, without a key)."""
        local_dir.mkdir(parents=True, exist_ok=True)
        for remote in self.fs.ls(self._path(step), detail=False):
            name = remote.rstrip("/").rsplit("/", 1)[-1]
            if manifest.SAFE_NAME.match(name) and self.fs.isfile(remote):
                self.fs.get_file(remote, str(local_dir / name))
        return local_dir

    def read_small(self, step: int, name: str, limit: int) -> bytes | None:
        """A small file of a checkpoint (at most ``limit`` bytes read), None when it is not there."""
        try:
            with self.fs.open(f"{self._path(step)}/{name}", "rb") as fh:
                return fh.read(limit)
        except (FileNotFoundError, IsADirectoryError):
            return None

    def download_file(self, step: int, name: str, into: Path, size: int) -> None:
        """One file of a checkpoint, only when it has the size its manifest says (else nothing is fetched)."""
        remote = f"{self._path(step)}/{name}"
        try:
            found = self.fs.size(remote)
        except FileNotFoundError:
            raise manifest.ManifestError(f"{name} is missing") from None
        if found != size:
            raise manifest.ManifestError(f"{name} has {found} bytes, the manifest says {size}")
        self.fs.get_file(remote, str(into))

    def fetch_verified(self, *, job_id: str, key: bytes | None) -> manifest.Fetched:
        """The newest complete checkpoint whose signed manifest verifies, downloaded; what was skipped."""
        return manifest.fetch_verified(
            self.complete_steps(),
            read=self.read_small,
            download=self.download_file,
            job_id=job_id,
            key=key,
            legacy=self.download,
        )

    def fetch_resume(self, *, job_id: str, key: bytes | None, points: list[Any]) -> manifest.Fetched:
        """What this run resumes from: its own newest checkpoint that its key signed (the process restarted
        within the run), else the first of ``points`` (JobSpec.resume: checkpoints of earlier runs the bot
        acknowledged, newest first) whose manifest has the digest the bot pinned. Nothing else: a checkpoint
        of an earlier run that the bot did not name is never looked at."""
        own = self.fetch_verified(job_id=job_id, key=key)
        if own.step is not None or not points:
            return own
        pinned = manifest.fetch_pinned(
            [(p.uri, p.step, p.manifest_sha256) for p in points],
            read=_read_at,
            download=_download_at,
            job_id=job_id,
        )
        pinned.skipped = own.skipped + pinned.skipped
        return pinned

    def upload(self, local_dir: Path, step: int, *, moved: Moved | None = None) -> str:
        """Upload a staged checkpoint, COMPLETE last; return its URI. ``moved`` counts the bytes sent."""
        moved = moved or Moved()
        self._uploads += 1
        kill_at = os.environ.get(KILL_DURING_SAVE_ENV)
        remote = self._path(step)
        if self.fs.exists(remote):  # leftover of a killed save at the same step
            self.fs.rm(remote, recursive=True)
        self.fs.makedirs(remote, exist_ok=True)
        for index, path in enumerate(sorted(p for p in local_dir.iterdir() if p.name != MARKER)):
            moved.put_file(self.fs, str(path), f"{remote}/{path.name}")
            if index == 0 and kill_at and int(kill_at) == self._uploads:
                os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.NamedTemporaryFile("w", suffix=".marker", delete=False) as fh:
            fh.write(f"step {step}\n")
        self.fs.put_file(fh.name, f"{remote}/{MARKER}")
        os.unlink(fh.name)
        return self.uri_of(step)

    def prune(self, keep: int, upto: int | None = None) -> list[int]:
        """Delete all but the newest `keep` complete checkpoints and every incomplete leftover. With ``upto``
        (the step just saved) folders of later steps are left alone and not counted: they are not this
        run's (a resume skipped them), and counting them could prune the run's own checkpoints."""
        listed = {s: ok for s, ok in self._listed().items() if upto is None or s <= upto}
        complete = sorted(s for s, ok in listed.items() if ok)
        doomed = [s for s, ok in listed.items() if not ok] + complete[:-keep]
        for step in doomed:
            self.fs.rm(self._path(step), recursive=True)
        return sorted(doomed)
