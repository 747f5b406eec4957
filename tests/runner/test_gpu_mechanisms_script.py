"""bench/gpu_check/mechanisms.py (issue 29's GPU check): without CUDA it says so and exits 0; every row it
measures carries a request the planner can price; and its replay of the real allocator's trace through the
planner's emulation splits the trace at the configuration markers the child writes."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check" / "mechanisms.py"
MB = 1 << 20


def _module():
    spec = importlib.util.spec_from_file_location("gpu_mechanisms", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_writes_nothing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run the script itself")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0 and "no CUDA device" in proc.stdout
    assert not list(tmp_path.iterdir())


def test_every_configuration_is_a_request_the_planner_prices() -> None:
    m = _module()
    lora = dict(model=m.MODEL, method="lora", lora_r=16, batch_size=2, seq_len=8192, loss="plain")
    lora.update(packing=False, length_grouping=True, expandable_segments=False, optimizer_impl="fused")
    full = dict(model=m.MODEL, method="full", precision="bf16", batch_size=2, seq_len=1024, loss="plain")
    full.update(packing=True, optimizer_impl="foreach")
    qlora = dict(model=m.MODEL, method="qlora", lora_r=16, batch_size=1, seq_len=4096, loss="chunked")
    qlora.update(packing=True, optimizer_impl="fused")
    rows = [{"request": lora}, {"request": full}, {"request": qlora}]
    for row in rows:
        plan = m.planned(row["request"], smoke=False)
        assert plan is not None and plan["torch_reserved"] > 1e9
        assert plan["ignored_fields"] == (["length_grouping"] if "length_grouping" in row["request"] else [])
    default = m.planned(dict(rows[0]["request"]), smoke=False)["torch_reserved"]
    expandable = m.planned(dict(rows[0]["request"], expandable_segments=True), smoke=False)["torch_reserved"]
    assert expandable < default  # the allocator mode reaches the estimate


def test_the_trace_replay_splits_at_the_markers_and_emulates_both_allocators(tmp_path: Path) -> None:
    m = _module()
    events = [[0, 0, 100 * MB]]  # weights, before the first configuration
    events += [[0, 1, m.MARK], [1, 1, m.MARK]]  # configuration 0 starts
    events += [[0, 2, 300 * MB], [1, 2, 0], [0, 3, 310 * MB], [1, 3, 0]]
    events += [[0, 4, m.MARK + 512], [1, 4, m.MARK + 512]]  # configuration 1 starts (cache emptied)
    events += [[0, 5, 50 * MB], [1, 5, 0]]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"mark_size": m.MARK, "events": events}, fh)
    rows = {r["mark"]: r for r in m.replay_trace(path)}
    assert set(rows) == {0, 1}
    # default: 310 MB needs a second segment beside the cached 300 MB one; expandable grows the same one
    assert rows[0]["emulated_reserved_default"] == 100 * MB + 20 * MB + 300 * MB + 310 * MB
    assert rows[0]["emulated_reserved_expandable"] == 420 * MB
    assert rows[1]["emulated_reserved_default"] == 100 * MB + 20 * MB + 50 * MB
