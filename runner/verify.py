"""A verification run: another run's output measured on this job's held-out split (``JobSpec.verify``).

A sweep names its winner on the eval loss the winner's own host reported (bot/engine/control/verify.py):
before it does, a run on another host, set up exactly as the winner was (same base model, data, split and
LoRA shape: the winner's plan), fetches the winner's output as its run signed it - the manifest's bytes must
hash to the digest the bot recorded (``verify.manifest_sha256``), each weights file its manifest's size and
SHA-256 - and measures the base model and then the output on the held-out split. It reports both as its
results (``eval_before``, ``eval_after``) and trains nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from runner.contract.spec import EventKind, Method, RunResults

ADAPTER_FILE = "adapter_model.safetensors"


def fetch_weights(uri: str, job_id: str, pinned: str, into: Path, *, full: bool) -> list[Path]:
    """The output's weights files at ``uri``, downloaded into ``into`` and checked against the manifest the
    digest ``pinned`` names (ManifestError when anything differs): the adapter, or a whole model's
    safetensors at the top of the folder."""
    import fsspec

    from runner.contract.manifest import (
        MAX_MANIFEST_BYTES,
        OUTPUT_MANIFEST,
        ManifestError,
        check_output,
        verify_files,
    )

    fs, root = fsspec.core.url_to_fs(uri.rstrip("/"))
    root = root.rstrip("/")
    with fs.open(f"{root}/{OUTPUT_MANIFEST}", "rb") as fh:
        raw = fh.read(4 * MAX_MANIFEST_BYTES + 1)
    entries = check_output(raw, job_id=job_id, pinned=pinned)

    def weights(name: str) -> bool:
        if not full:
            return name == ADAPTER_FILE
        return "/" not in name and name.endswith(".safetensors")  # the model, not merged/ or others

    wanted = {name: entry for name, entry in entries.items() if weights(name)}
    if not wanted:
        raise ManifestError("the output has no weights to measure")
    for name, entry in wanted.items():
        copied = 0
        with fs.open(f"{root}/{name}", "rb") as src, open(into / name, "wb") as dst:
            while chunk := src.read(min(8 * 1024**2, entry.size - copied + 1)):
                copied += len(chunk)
                if copied > entry.size:
                    raise ManifestError(f"{name} is longer than its manifest says")
                dst.write(chunk)
    verify_files(into, wanted)
    return [into / n for n in wanted if n.endswith(".safetensors")]


def load_weights(trainer: Any, files: list[Path]) -> None:
    """The fetched weights into the model being measured: the adapter's LoRA tensors (peft's names), or a
    whole model's tensors (strict: every weight of the model must be there)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in files:
        state.update(load_file(str(path)))
    model = trainer.model
    if trainer.spec.method is Method.full:
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {k for k in missing if k.endswith("lm_head.weight")}  # tied to the embeddings
        if set(missing) - tied or unexpected:
            raise ValueError(f"the output's weights do not fit the model ({len(missing)} missing)")
        return
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    if getattr(result, "unexpected_keys", None):
        raise ValueError("the output's adapter does not fit the model's LoRA layers")


def verify(trainer: Any) -> str:
    """Measure the base model, then the output named by ``spec.verify``; report both and return "finished"."""
    import contextlib

    spec = trainer.spec
    target = spec.verify
    assert target is not None
    clock = trainer.clock
    trainer.emit(EventKind.started, message=f"measuring job {target.job_id}'s output again")
    full = spec.method is Method.full
    with clock.phase("base_eval"):
        off = contextlib.nullcontext() if full else trainer.model.disable_adapter()
        with off:
            before = trainer.evaluate()
    with tempfile.TemporaryDirectory(prefix="tunebot-verify-") as tmp:
        with clock.phase("load"):
            files = fetch_weights(target.uri, target.job_id, target.manifest_sha256, Path(tmp), full=full)
            load_weights(trainer, files)
    with clock.phase("evals"):
        after = trainer.evaluate()
    if trainer.group is not None and trainer.group.main:
        print(f"verification: eval loss {before:.4f} (base model) -> {after:.4f} (job {target.job_id})")
    trainer.results = RunResults(
        eval_before=before,
        eval_after=after,
        last_eval=after,
        evaluations=1,
        keep="last",
        why=f"job {target.job_id}'s output, measured again on this host",
    )
    trainer.emit(EventKind.results, results=trainer.results)
    trainer.emit(
        EventKind.finished,
        message=f"measured job {target.job_id}'s output again: eval loss {before:.4f} -> {after:.4f}",
    )
    return "finished"
