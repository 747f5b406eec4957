"""Several GPUs talk over what the box really has: NVLink on SXM boards, PCIe elsewhere, and through host
memory on GeForce cards (no peer-to-peer). 8 PCIe consumer cards wait on communication."""

from __future__ import annotations

import pytest
from fakes.snapshot_plan import snapshot_plan

from bot.planner.architectures import from_config
from bot.planner.gpus import GPUS, PCIE_GBS
from bot.planner.models import table_lookup
from bot.planner.request import EstimateRequest
from bot.planner.speed import estimate_speed


def test_the_gpu_table_knows_each_cards_links() -> None:
    for name in ("rtx-3090", "rtx-4090"):
        assert GPUS[name].interconnect_gbs == PCIE_GBS[4] / 2 and "no peer-to-peer" in GPUS[name].link
    for name in ("rtx-a6000", "rtx-6000-ada", "l40s"):
        assert GPUS[name].interconnect_gbs == PCIE_GBS[4] and "PCIe 4.0" in GPUS[name].link
    for name in ("a100-80gb", "h100-80gb", "h200"):
        assert GPUS[name].interconnect_gbs >= 300 and "NVLink" in GPUS[name].link
    assert GPUS["h100-80gb"].host_link_gbs == PCIE_GBS[5]  # paged optimizer states cross PCIe, not NVLink


def test_eight_pcie_consumer_cards_are_priced_communication_bound() -> None:
    req = EstimateRequest(model="llama-3.1-8b", method="full", gpus=8, tokens=10_000_000)
    hit = table_lookup("llama-3.1-8b")
    assert hit is not None
    arch = from_config(hit.config, hit.model_id)
    rtx = estimate_speed(arch, req, GPUS["rtx-3090"], 8)
    a100 = estimate_speed(arch, req, GPUS["a100-80gb"], 8)
    assert rtx.parts is not None and rtx.parts["communication"] > 2 * rtx.parts["matmul"]
    assert rtx.mfu < 0.4 < a100.mfu  # a9605e4: 73% on 8x RTX 3090, as if over NVLink
    est = snapshot_plan(req.model_copy(update={"gpu": "rtx-3090"}))
    assert est.speed.mfu == pytest.approx(rtx.mfu, abs=0.01)
    assert any("PCIe 4.0 x16 (12.5 GB/s per GPU, no peer-to-peer" in a for a in est.assumptions)
