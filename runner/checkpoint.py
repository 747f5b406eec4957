"""Checkpoints that survive being killed at any moment, synced to any fsspec URI.

Layout under the checkpoint URI (a folder, s3://bucket/prefix, memory://..., any fsspec URI):

    <uri>/checkpoint-<step>/
        adapter_model.safetensors | model.safetensors   trainable weights (adapter for LoRA/QLoRA)
        optimizer.pt  scheduler.pt                       torch state dicts
        rng_state_<rank>.pth                             python, numpy, torch and CUDA RNG per rank
        trainer_state.json                               step, data position, tokens, plateau, seq, W&B id
        job.json                                         the spec the checkpoint was made with
        COMPLETE                                         written LAST: only a checkpoint with it is used
    <uri>/progress.json                                  written by runner.report (latest RunnerEvent)

A checkpoint is written to a local staging folder first, then uploaded file by file with COMPLETE last.
The previous complete checkpoint stays until the new one has its marker; then the oldest are pruned to
`keep`, and incomplete leftovers of killed saves are removed.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import torch

MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
ADAPTER_FILE = "adapter_model.safetensors"
MODEL_FILE = "model.safetensors"
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
    reporter_seq: int = 0
    wandb_run_id: str | None = None
    plateau: dict[str, Any] = field(default_factory=dict)
    train_seconds: float = 0.0  # time spent training before this checkpoint, across resumes
    world_size: int = 1

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def write_local(
    out_dir: Path,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainState,
    rng_states: list[dict[str, Any]],
    spec_json: str,
) -> None:
    """Write one checkpoint into a local folder (no marker: the upload adds it last)."""
    from safetensors.torch import save_file, save_model

    out_dir.mkdir(parents=True, exist_ok=True)
    if _is_peft(model):
        from peft import get_peft_model_state_dict

        tensors = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}
        save_file(tensors, str(out_dir / ADAPTER_FILE))
    else:
        save_model(model, str(out_dir / MODEL_FILE))
    torch.save(optimizer.state_dict(), out_dir / "optimizer.pt")
    torch.save(scheduler.state_dict(), out_dir / "scheduler.pt")
    for rank, rng in enumerate(rng_states):
        torch.save(rng, out_dir / f"rng_state_{rank}.pth")
    (out_dir / STATE_FILE).write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    (out_dir / "job.json").write_text(spec_json, encoding="utf-8")


def read_local(
    ckpt_dir: Path, *, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int = 0
) -> TrainState:
    """Restore weights, optimizer, scheduler and this rank's RNG from a local checkpoint folder."""
    from safetensors.torch import load_file, load_model

    if _is_peft(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(ckpt_dir / ADAPTER_FILE)))
    else:
        load_model(model, str(ckpt_dir / MODEL_FILE))
    optimizer.load_state_dict(torch.load(ckpt_dir / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(ckpt_dir / "scheduler.pt", weights_only=False))
    rng_path = ckpt_dir / f"rng_state_{rank}.pth"
    if not rng_path.exists():  # resumed with more processes than saved it: share rank 0's stream
        rng_path = ckpt_dir / "rng_state_0.pth"
    set_rng_state(torch.load(rng_path, weights_only=False))
    return TrainState.from_dict(json.loads((ckpt_dir / STATE_FILE).read_text(encoding="utf-8")))


class CheckpointStore:
    """The checkpoint URI: list complete checkpoints, upload with the marker last, download, prune."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.uri)
        self.root = self.root.rstrip("/")
        self._uploads = 0

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
                    m.endswith(f"checkpoint-{step}/{MARKER}") for m in markers)
        return found

    def complete_steps(self) -> list[int]:
        return sorted(step for step, complete in self._listed().items() if complete)

    def newest_complete(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def download(self, step: int, local_dir: Path) -> Path:
        local_dir.mkdir(parents=True, exist_ok=True)
        for remote in self.fs.find(self._path(step)):
            name = remote.rstrip("/").rsplit("/", 1)[-1]
            self.fs.get_file(remote, str(local_dir / name))
        return local_dir

    def upload(self, local_dir: Path, step: int) -> str:
        """Upload a staged checkpoint, COMPLETE last; return its URI."""
        self._uploads += 1
        kill_at = os.environ.get(KILL_DURING_SAVE_ENV)
        remote = self._path(step)
        if self.fs.exists(remote):  # leftover of a killed save at the same step
            self.fs.rm(remote, recursive=True)
        self.fs.makedirs(remote, exist_ok=True)
        for index, path in enumerate(sorted(p for p in local_dir.iterdir() if p.name != MARKER)):
            self.fs.put_file(str(path), f"{remote}/{path.name}")
            if index == 0 and kill_at and int(kill_at) == self._uploads:
                os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.NamedTemporaryFile("w", suffix=".marker", delete=False) as fh:
            fh.write(f"step {step}\n")
        self.fs.put_file(fh.name, f"{remote}/{MARKER}")
        os.unlink(fh.name)
        return self.uri_of(step)

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest `keep` complete checkpoints and every incomplete leftover."""
        listed = self._listed()
        complete = sorted(s for s, ok in listed.items() if ok)
        doomed = [s for s, ok in listed.items() if not ok] + complete[:-keep]
        for step in doomed:
            self.fs.rm(self._path(step), recursive=True)
        return sorted(doomed)
