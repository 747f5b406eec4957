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
