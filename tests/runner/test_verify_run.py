"""A verification run measures another run's output as its run signed it (issue 38, item 2; runner/verify.py):
the base model and the output on the same held-out split, the figures the trained run reported; an output
whose weights differ from what its manifest pinned is refused, nothing measured.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract import manifest
from runner.contract.spec import EXIT_OK, EventKind, parse_progress
from runner.train import run

JOB = {"max_steps": 6, "seq_len": 128, "micro_batch_size": 4, "grad_accum": 1, "keep": "last"}


def _results(spec: Any) -> Any:
    events = parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_text())
    (results,) = [e.results for e in events if e.kind is EventKind.results]
    return results, events


@pytest.fixture
def trained(runner_job: Callable[..., Any], runner_tiny_dir: Path, tmp_path: Path) -> Any:
    """The tiny job trained on 120 records with a 10% eval split: its spec and what it reported."""
    data = tmp_path / "small.jsonl"
    data.write_text("".join((runner_tiny_dir / "data.jsonl").read_text().splitlines(keepends=True)[:120]))
    spec = runner_job(dataset={"uri": str(data), "eval_fraction": 0.1}, report={"every_seconds": 0.5}, **JOB)
    summary, code = run(spec)
    assert code == EXIT_OK, summary
    return spec, _results(spec)[0]


def _verifier(spec: Any, tmp_path: Path) -> Any:
    body = (Path(spec.output_uri) / manifest.OUTPUT_MANIFEST).read_bytes()
    return spec.model_copy(
        update={
            "job_id": "verifier",
            "checkpoint": spec.checkpoint.model_copy(update={"uri": str(tmp_path / "v-ckpt")}),
            "output_uri": str(tmp_path / "v-out"),
            "verify": {
                "job_id": spec.job_id,
                "uri": spec.output_uri,
                "manifest_sha256": manifest.sha256_of(body),
            },
        }
    )


@pytest.mark.slow
def test_the_output_measured_again_gives_the_figures_its_run_reported(trained: Any, tmp_path: Path) -> None:
    from runner.contract.spec import JobSpec

    spec, claimed = trained
    checker = JobSpec.model_validate(_verifier(spec, tmp_path).model_dump())
    summary, code = run(checker)
    assert code == EXIT_OK and summary.steps == 0, summary  # nothing trained
    measured, events = _results(checker)
    assert measured.eval_before == pytest.approx(claimed.eval_before, rel=1e-5)
    assert measured.eval_after == pytest.approx(claimed.eval_after, rel=1e-5)
    assert measured.eval_after < measured.eval_before  # the trained adapter, not the base model, measured
    assert events[-1].kind is EventKind.finished and not Path(checker.output_uri).exists()


@pytest.mark.slow
def test_an_output_changed_after_its_run_signed_it_is_not_measured(trained: Any, tmp_path: Path) -> None:
    from runner.contract.spec import JobSpec

    spec, _ = trained
    checker = JobSpec.model_validate(_verifier(spec, tmp_path).model_dump())
    adapter = Path(spec.output_uri) / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-8:] = b"\x00" * 8  # the host swaps the weights after signing the manifest
    adapter.write_bytes(bytes(data))
    summary, code = run(checker)
    assert code != EXIT_OK and summary.status == "failed", summary
    assert "adapter_model.safetensors" in (summary.message or ""), summary.message
    events = parse_progress((Path(checker.checkpoint.uri) / "progress.json").read_text())
    assert not [e for e in events if e.kind is EventKind.results]
