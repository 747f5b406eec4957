"""Console rendering with rich: the same replies, as text."""

from __future__ import annotations

from rich.console import Console

from bot.chat import cards
from bot.chat.replies import Reply, Text
from bot.chat.terminal import markup, render

from .fake_engine import make_estimate


def rendered(reply: Reply) -> str:
    console = Console(width=140, record=True, force_terminal=False, color_system=None)
    render(reply, console)
    return console.export_text()


def test_estimate_renders_as_table_with_options() -> None:
    out = rendered(cards.estimate_reply(make_estimate(), estimate_id="e1"))
    assert "Llama-3.1-8B · qlora" in out
    assert "Memory per GPU" in out and "17.2 GB" in out
    assert "provider" in out and "vast" in out and "$1.00" in out
    assert "options:" in out and "Launch cheapest" in out


def test_markup_is_escaped_and_slack_bits_translated() -> None:
    assert (
        markup("*bold* and `code` [red]x[/red]") == "[bold]bold[/bold] and [cyan]code[/cyan] \\[red]x\\[/red]"
    )
    out = rendered(Reply(parts=[Text(":warning: [not markup] *hey*")]))
    assert "! [not markup] hey" in out


def test_estimate_card_shows_ranges_and_calibration() -> None:
    """A real estimate: '14.9 GB (13.6-16.6)', the time and cost ranges, and where calibration came from."""
    from fakes.snapshot_plan import snapshot_plan

    from bot.planner import EstimateRequest
    from bot.planner.calibration import Measurement
    from bot.planner.inputs import calibrate

    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="qlora", gpu="rtx-4090", tokens=20_000_000)
    run = Measurement(gpu="rtx-4090", request=req.model_dump(), tokens_per_second=800.0)
    plain = snapshot_plan(req)
    est = snapshot_plan(req, calibration=calibrate([run, run.model_copy(update={"job_id": "2"})]))
    mem = est.memory
    out = rendered(cards.estimate_reply(est, estimate_id="e1"))
    lo, hi = mem.per_gpu_gb_range
    # the top is a promise: how often it held on published runs, each source left out whole (issue 36)
    assert f"{mem.per_gpu_gb:.1f} GB ({lo:.1f}-{hi:.1f}; the top covers 97% of measured runs)" in out
    assert "calibrated from 2 runs on rtx-4090" in out
    cheapest = next(o for o in est.offers if "cheapest" in o.labels)
    assert cards.cost_span(cheapest) in out and "-" in cards.cost_span(cheapest)
    assert est.time.hours > plain.time.hours  # the runs were slower than the physics: the card says so
    assert "calibrated" not in rendered(cards.estimate_reply(plain, estimate_id="e2"))


def test_backslashes_are_printed_as_typed() -> None:
    """A final backslash is not doubled, and one ending `code` or *bold* cannot escape the closing tag."""
    out = rendered(Reply(parts=[Text("path C:\\dir\\ and `D:\\x\\` and *E:\\* [red]end\\")]))
    assert "path C:\\dir\\ and D:\\x\\ and E:\\ [red]end\\\n" in out
