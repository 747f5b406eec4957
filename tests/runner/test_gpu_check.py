"""bench/gpu_check: without CUDA it says so, writes nothing and exits 0; what it writes on a GPU is a valid
`tunebot calibrate import` file whose every row the planner can predict.

The check itself needs a GPU and has not run in CI or on the machine that wrote it (see its README).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.engine.outcome.calibration import parse_import

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_writes_nothing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run bench/gpu_check/run.sh itself")
    out = tmp_path / "cal.csv"
    proc = subprocess.run(
        [
            str(ROOT / "bench" / "gpu_check" / "run.sh"),
            "--out",
            str(tmp_path / "t.md"),
            "--calibration",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout and not out.exists() and not (tmp_path / "t.md").exists()


def test_the_runner_against_the_trainer_plumbing_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/gpu_check/versus_trainer.py's whole path on the CPU (--cpu-plumbing): a model built from a config
    with random weights and a word-level tokenizer, the planner's choice and quote for the card, the runner
    (runner.train.run) and the Hugging Face Trainer (bf16=True, PEFT; QLoRA through bitsandbytes and
    prepare_model_for_kbit_training) each in its own process on the same data and effective batch, and the
    table with both rows and their ratio. The GPU figures need a GPU (bench/gpu_check/README.md)."""
    out = tmp_path / "table.md"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check" / "versus_trainer.py"),
            "--cpu-plumbing",
            "--step-tokens",
            "512",
            "--out",
            str(out),
            "--calibration",
            str(tmp_path / "cal.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| tiny")]
    assert [(r[1].strip(), r[3].strip()) for r in rows] == [
        ("lora", "runner"),
        ("lora", "trainer"),
        ("qlora", "runner"),
        ("qlora", "trainer"),
    ]
    for cells in rows:  # measured tokens/s on both stacks, the quote beside them, the ratio
        assert float(cells[5].replace(",", "")) > 0, cells
        assert float(cells[7].replace(",", "")) > 0 and float(cells[9]) > 0, cells
    assert not (tmp_path / "cal.csv").exists()  # a tiny model's rows teach the planner nothing
    # what each runner row ran on, from its log: on this CPU torch's kernels, and why not Liger's
    table = out.read_text()
    for row in ("tiny lora 64", "tiny qlora 128"):
        assert f"- {row}: kernels: torch, not Liger: no CUDA device" in table, table


def test_rows_it_writes_are_a_valid_import_file(tmp_path: Path) -> None:
    gc = _module()
    results = [
        {
            "method": "lora",
            "seq_len": 1024,
            "max_memory_reserved_gb": 6.1,
            "device_memory_used_gb": 7.0,
            "tokens_per_second": 31000.0,
            "mfu": 0.31,
        },
        {
            "method": "qlora",
            "seq_len": 4096,
            "max_memory_reserved_gb": 9.5,
            "device_memory_used_gb": None,
            "tokens_per_second": 18000.0,
        },
    ]
    out = tmp_path / "cal.csv"
    gc.write_csv(gc.calibration_rows("h100-80gb", results), out)
    measurements = parse_import(out.read_text(), out.name)
    assert [(m.gpu, m.request["method"], int(m.request["seq_len"])) for m in measurements] == [
        ("h100-80gb", "lora", 1024),
        ("h100-80gb", "qlora", 4096),
    ]
    assert measurements[0].device_memory_used_gb == 7.0 and measurements[1].device_memory_used_gb is None
    assert measurements[1].request["model"] == "meta-llama/Llama-3.2-1B"
    from bot.planner.inputs import predict_measurement

    assert all(predict_measurement(m) is not None for m in measurements)  # the planner can learn from them


def test_the_planner_figures_for_the_check_model() -> None:
    gc = _module()
    lora = gc.planner_figures("h200", "lora", 4096)
    qlora = gc.planner_figures("h200", "qlora", 4096)
    assert 0 < qlora["memory_gb"] < lora["memory_gb"] < 40  # a 1.2B model: QLoRA stores 4-bit weights
    assert lora["tokens_per_second"] > qlora["tokens_per_second"] > 0 and 0 < lora["mfu"] < 1
    assert gc.planner_figures(None, "lora", 1024) is None


@pytest.mark.parametrize(
    ("name", "memory", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", 42.4, "a100-40gb"),
        ("NVIDIA A100 80GB PCIe", 85.1, "a100-80gb"),
        ("NVIDIA H100 80GB HBM3", 85.0, "h100-80gb"),
        ("NVIDIA GeForce RTX 4090", 25.2, "rtx-4090"),
        ("NVIDIA RTX 6000 Ada Generation", 51.0, "rtx-6000-ada"),
        ("NVIDIA RTX A6000", 51.0, "rtx-a6000"),
        ("Tesla T4", 15.8, None),
    ],
)
def test_device_names_map_to_the_planners_gpus(name: str, memory: float, expected: str | None) -> None:
    assert _module().planner_gpu(name, memory) == expected
