"""The quote by phase a GPU check prints beside each row it measures (issue 36 item 7): bench/gpu_check calls
bot.planner.quote.quote_by_phase(request, card); its phases are the whole run and add up to its hours."""

from __future__ import annotations

import pytest

from bot.planner.quote import quote_by_phase
from bot.planner.request import EstimateRequest
from runner.contract.phases import PHASES


def test_a_gpu_rows_quote_by_phase_adds_up_to_the_whole_run() -> None:
    req = EstimateRequest(
        model="meta-llama/Llama-3.2-1B",
        method="qlora",
        seq_len=4096,
        batch_size=1,
        grad_accum=1,
        gradient_checkpointing=True,
        max_steps=23,
        tokens=23 * 4096,
    )
    q = quote_by_phase(req, "h100-80gb")
    phases = q["phases"]
    assert set(PHASES) <= set(phases)
    assert sum(phases.values()) == pytest.approx(q["hours"] * 3600, abs=2.0)
    # 22 steady steps after the first: the steps, optimizer and logging phases are 22 steps' worth
    steady = phases["steps"] + phases["optimizer"] + phases["logging"]
    assert steady == pytest.approx(22 * q["step_seconds"], rel=0.02)
    low, high = q["tokens_per_second_range"]
    assert low < q["tokens_per_second"] < high
    assert 0 < q["memory_gb"] < 80
    # The start (boot, imports) and the output are priced, not just the steps.
    assert phases["start"] > 60 and phases["output"] > 0 and phases["load"] > 0


def test_the_w_and_b_start_is_priced_where_the_run_logs_to_it() -> None:
    """W&B's start (wandb imported, its service and run started; online, the wait on its server, at the bound
    the runner holds it to) is its own phase of the quote, nothing where W&B is off (a bot without a key)."""
    from bot.planner.phases import WANDB_START_SECONDS
    from runner.contract.spec import WANDB_INIT_TIMEOUT_S

    req = EstimateRequest(model="meta-llama/Llama-3.2-1B", method="lora", seq_len=1024, max_steps=10)
    off, offline, online = (
        quote_by_phase(req.model_copy(update={"wandb": mode}), "h100-80gb")["phases"]
        for mode in ("disabled", "offline", "online")
    )
    assert off["wandb"] == 0.0
    assert offline["wandb"] == pytest.approx(WANDB_START_SECONDS, rel=0.01)
    assert online["wandb"] == pytest.approx(WANDB_START_SECONDS + WANDB_INIT_TIMEOUT_S, rel=0.01)
    assert {k: v for k, v in offline.items() if k != "wandb"} == {
        k: v for k, v in off.items() if k != "wandb"
    }
