"""make-tiny: an offline tiny model, tokenizer, dataset and job that are byte-identical for a seed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from runner.contract.spec import JobSpec
from runner.tiny import make_tiny


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(
    runner_tiny_dir: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    make_tiny(again, seed=0)
    first, second = _hashes(runner_tiny_dir), _hashes(again)
    assert (
        set(first)
        == set(second)
        >= {"job.json", "data.jsonl", "model/config.json", "model/model.safetensors", "model/tokenizer.json"}
    )
    differing = {name for name in first if first[name] != second[name]}
    assert differing == {"job.json"}  # only because it names its own folder
    job_text = (again / "job.json").read_text()
    normalised = job_text.replace(str(again.resolve()), str(runner_tiny_dir.resolve()))
    assert normalised == (runner_tiny_dir / "job.json").read_text()

    other = tmp_path / "other"
    make_tiny(other, seed=1)
    changed = {n for n, h in _hashes(other).items() if first.get(n) != h}
    assert {"data.jsonl", "model/model.safetensors"} <= changed


def test_job_points_inside_the_folder_and_loads_offline(runner_tiny_dir: Path) -> None:
    spec = JobSpec.model_validate_json((runner_tiny_dir / "job.json").read_text())
    root = str(runner_tiny_dir.resolve())
    assert spec.base_model.startswith(root) and spec.dataset.uri.startswith(root)
    assert spec.checkpoint.uri == f"{root}/checkpoints" and spec.output_uri == f"{root}/output"
    assert spec.gpus == 0
    records = [json.loads(line) for line in (runner_tiny_dir / "data.jsonl").read_text().splitlines()]
    assert 200 <= len(records) <= 1000
    lengths = sorted(len(r["output"]) for r in records)
    assert lengths[-1] > 4 * lengths[len(lengths) // 2]  # skewed: a long tail

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec.base_model)
    model = AutoModelForCausalLM.from_pretrained(spec.base_model)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.num_key_value_heads == 2 and len(tokenizer) <= model.config.vocab_size
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], tokenize=False
    )
    assert "<|assistant|>" in chat and "yo</s>" in chat


def test_cli_make_tiny_writes_the_job_for_the_method(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner.cli",
            "make-tiny",
            str(tmp_path / "t"),
            "--seed",
            "3",
            "--method",
            "qlora",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr
    job = Path(out.stdout.strip().splitlines()[-1])
    spec = JobSpec.model_validate_json(job.read_text())
    assert spec.method.value == "qlora" and spec.seed == 3
