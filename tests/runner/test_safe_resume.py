"""A host that can write another job's checkpoint folder cannot make that job run its code (issue 19).

Attack reported on a9605e4: with bucket-wide keys, job A's host planted ``checkpoint-999999/`` (a copy of a
real checkpoint with a pickled ``optimizer.pt`` whose unpickling runs code) in job B's folder; B's resume
took the newest complete checkpoint and ran ``torch.load(weights_only=False)`` on it. Now a resume takes
only a checkpoint whose manifest this job's key signed, checks every file's size and SHA-256 first, and
loads tensors with ``weights_only=True``.
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from runner import checkpoint as ckpt
from runner.contract.spec import EXIT_OK, parse_progress
from runner.train import run

# runner/contract/integrity.py (spelled out: the attack tests also run on the old code)
KEY_ENV = "TUNEBOT_JOB_KEY"
KEY = "5e" * 32
OTHER_KEY = "a1" * 32


class _RunsCode:
    """Unpickling this runs ``open(marker, 'w')``: what a planted optimizer.pt does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def plant(path: Path, marker: Path) -> None:
    torch.save({"state": _RunsCode(marker), "param_groups": []}, path)


@pytest.fixture
def job(runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    monkeypatch.setenv(KEY_ENV, KEY)
    return lambda **kw: runner_job(
        **{
            "seq_len": 128,
            "grad_accum": 1,
            "plateau": {"enabled": False},
            "checkpoint": {"every_minutes": 1e-9, "keep": 2},
            **kw,
        }
    )


def events(spec: Any) -> list[Any]:
    return parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())


def test_a_planted_newer_checkpoint_is_ignored_and_its_pickle_never_runs(job, tmp_path: Path) -> None:
    first = job(max_steps=3)
    _, code = run(first)
    assert code == EXIT_OK
    root = Path(first.checkpoint.uri)
    assert sorted(p.name for p in root.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    # Another job's host copies a real checkpoint to step 999999 and swaps in a pickle that runs code.
    planted = root / "checkpoint-999999"
    shutil.copytree(root / "checkpoint-2", planted)
    marker = tmp_path / "pwned"
    plant(planted / "optimizer.pt", marker)

    summary, code = run(job(max_steps=5))
    assert not marker.exists(), "the planted pickle ran"
    assert code == EXIT_OK, summary
    assert summary.resumed_from is not None and summary.resumed_from.endswith("/checkpoint-2")
    assert summary.steps == 5
    warnings = [e.message for e in events(first) if e.kind == "warning"]
    assert warnings == [f"ignored checkpoint-999999: manifest names job '{first.job_id}' step 2"], warnings
    assert planted.exists()  # not this run's: left alone, and never counted when pruning its own
    own = sorted(int(p.name.split("-")[1]) for p in root.glob("checkpoint-*") if p != planted)
    # keep=2 of its own: the newest two saved (steps 3 and 4; 2 and 3 when step 3's save was still being
    # written at the end of step 4, which skips that timed save rather than block the step loop)
    assert len(own) == 2 and own[-1] in (3, 4), own


def test_a_swapped_file_in_the_newest_checkpoint_falls_back_to_the_one_before(job, tmp_path: Path) -> None:
    first = job(max_steps=3)
    run(first)
    root = Path(first.checkpoint.uri)
    marker = tmp_path / "pwned"
    plant(root / "checkpoint-2" / "optimizer.pt", marker)  # same name, other bytes

    summary, code = run(job(max_steps=4))
    assert not marker.exists(), "the swapped pickle ran"
    assert code == EXIT_OK, summary
    assert summary.resumed_from is not None and summary.resumed_from.endswith("/checkpoint-1")
    (warning,) = [e.message for e in events(first) if e.kind == "warning"]
    assert "checkpoint-2" in warning and "optimizer.pt" in warning


def test_a_checkpoint_signed_with_another_jobs_key_is_ignored(job, tmp_path: Path) -> None:
    from runner.contract import manifest

    first = job(max_steps=3)
    run(first)
    root = Path(first.checkpoint.uri)
    folder = root / "checkpoint-2"
    marker = tmp_path / "pwned"
    plant(folder / "optimizer.pt", marker)
    # The attacker recomputes the manifest, with its own job's key.
    (folder / "manifest.json").write_text(
        json.dumps(manifest.build(folder, job_id=first.job_id, step=2, key=bytes.fromhex(OTHER_KEY)))
    )
    summary, code = run(job(max_steps=4))
    assert code == EXIT_OK and not marker.exists()
    assert summary.resumed_from is not None and summary.resumed_from.endswith("/checkpoint-1")


def test_optimizer_scheduler_and_rng_states_load_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    plant(tmp_path / "optimizer.pt", marker)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(Exception) as refused:  # noqa: PT011 - the old code ran it, then failed otherwise
        ckpt.read_optimizer(tmp_path, model, optimizer, fsdp=False)
    assert not marker.exists(), "torch.load ran the pickle"
    assert isinstance(refused.value, pickle.UnpicklingError)
    # The real states round-trip under weights_only=True.
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    ckpt.read_optimizer(tmp_path, model, torch.optim.AdamW(model.parameters()), fsdp=False)
    state = ckpt.rng_state()
    torch.save(state, tmp_path / "rng.pth")
    expected = torch.rand(3)
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pth", weights_only=True))
    assert torch.equal(torch.rand(3), expected)


def test_manifest_checks(tmp_path: Path) -> None:
    from runner.contract import manifest
    from runner.contract.integrity import MANIFEST, sign

    key = bytes.fromhex(KEY)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"w" * 10)
    (tmp_path / "trainer_state.json").write_text("{}")
    good = manifest.build(tmp_path, job_id="j1", step=4, key=key)
    raw = json.dumps(good).encode()
    assert set(manifest.check(raw, job_id="j1", step=4, key=key)) == {
        "adapter_model.safetensors",
        "trainer_state.json",
    }
    bad = {
        "not signed": json.dumps({k: v for k, v in good.items() if k != "mac"}),
        "other job": json.dumps(sign(key, MANIFEST, {**good, "job_id": "j2"})),
        "path": json.dumps(sign(key, MANIFEST, {**good, "files": {"../x": {"size": 1, "sha256": "0" * 64}}})),
        "size": json.dumps(sign(key, MANIFEST, {**good, "files": {"a": {"size": -1, "sha256": "0" * 64}}})),
    }
    for why, text in bad.items():
        with pytest.raises(manifest.ManifestError):
            manifest.check(text.encode(), job_id="j1", step=4, key=key)
        assert why
    with pytest.raises(manifest.ManifestError, match="step"):
        manifest.check(raw, job_id="j1", step=5, key=key)
    entries = manifest.check(raw, job_id="j1", step=4, key=key)
    manifest.verify_files(tmp_path, entries)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"x" * 10)
    with pytest.raises(manifest.ManifestError, match="SHA-256"):
        manifest.verify_files(tmp_path, entries)


def test_a_former_runs_host_cannot_make_the_next_run_load_its_checkpoint(
    runner_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 28: on eac3cff every run of a job signed with the same key, so the host of an earlier run could
    sign a checkpoint manifest that the next resume accepted. Now each run has its own key and folder, and
    a run loads an earlier run's checkpoint only as the bot pinned it (JobSpec.resume: the manifest's
    digest, taken from that run's signed event while it was current)."""
    from runner.contract import manifest

    def spec(run: str, key: str, **kw: Any) -> Any:
        monkeypatch.setenv(KEY_ENV, key)
        return runner_job(
            seq_len=128,
            grad_accum=1,
            plateau={"enabled": False},
            checkpoint={"uri": str(tmp_path / run / "checkpoints"), "every_minutes": 1e-9, "keep": 2},
            output_uri=str(tmp_path / run / "output"),
            run_id=run,
            **kw,
        )

    first = spec("r1", KEY, max_steps=3)
    assert run(first)[1] == EXIT_OK
    acked = [e for e in events(first) if e.kind == "checkpoint" and e.manifest_sha256]
    pins = [
        {"uri": e.checkpoint_uri, "step": e.step, "manifest_sha256": e.manifest_sha256}
        for e in reversed(acked)
    ]
    assert [p["step"] for p in pins] == [2, 1]
    # The first run's host, after its run ended, with its old key: a newer checkpoint signed with that key,
    # and the newest acknowledged one's optimizer swapped with its manifest signed again.
    root, marker = Path(first.checkpoint.uri), tmp_path / "pwned"
    planted = root / "checkpoint-999999"
    shutil.copytree(root / "checkpoint-2", planted)
    plant(planted / "optimizer.pt", marker)
    (planted / "manifest.json").write_text(
        json.dumps(manifest.build(planted, job_id=first.job_id, step=999999, key=bytes.fromhex(KEY)))
    )
    plant(root / "checkpoint-2" / "optimizer.pt", marker)
    (root / "checkpoint-2" / "manifest.json").write_text(
        json.dumps(manifest.build(root / "checkpoint-2", job_id=first.job_id, step=2, key=bytes.fromhex(KEY)))
    )

    second = spec("r2", OTHER_KEY, max_steps=4, resume=pins)
    summary, code = run(second)
    assert not marker.exists(), "the former host's pickle ran"
    assert code == EXIT_OK, summary
    assert summary.resumed_from == f"{root}/checkpoint-1"  # the rewritten one refused, never the planted one
    (warning,) = [e.message for e in events(second) if e.kind == "warning"]
    assert "checkpoint-2" in warning and "acknowledged" in warning
    assert not list((tmp_path / "r2" / "checkpoints").glob("checkpoint-9*"))
    # Not named by the bot, an earlier run's folder is never looked at: a run without pins starts over.
    third = spec("r3", "77" * 32, max_steps=2)
    again, code = run(third)
    assert code == EXIT_OK and again.resumed_from is None and not marker.exists()
