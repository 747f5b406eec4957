"""bench/gpu_check: without CUDA it says so and exits 0; its planner comparison works from a config.json."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_without_cuda_it_says_so_and_exits_cleanly() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run bench/gpu_check/run.sh itself")
    out = subprocess.run([str(ROOT / "bench/gpu_check/run.sh")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr
    assert "no CUDA device" in out.stdout


def test_the_planner_estimate_for_the_check_model(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench/gpu_check/gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**module.CONFIG, "architectures": ["LlamaForCausalLM"],
                                  "model_type": "llama", "torch_dtype": "bfloat16"}))
    lora = module.planner_estimate(config, "lora", 2048, "h200")
    qlora = module.planner_estimate(config, "qlora", 2048, "h200")
    assert isinstance(lora, dict) and isinstance(qlora, dict), (lora, qlora)
    assert 0 < qlora["memory_gb"] < lora["memory_gb"] < 40  # a ~0.5B model: QLoRA stores 4-bit weights
    assert lora["tokens_per_second"] > 0
