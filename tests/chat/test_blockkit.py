"""Block Kit rendering stays inside Slack's limits and always has a text fallback."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.chat import cards
from bot.chat.blockkit import MAX_BLOCKS, to_blocks, to_home_view, to_message, violations
from bot.chat.replies import Button, Buttons, Confirm, Context, Fields, Header, Reply, Table, Text

from .fake_engine import make_estimate


def test_estimate_with_many_offers_fits_the_limits() -> None:
    reply = cards.estimate_reply(make_estimate(n_offers=400), estimate_id="e123", launching=True)
    msg = to_message(reply)
    assert violations(msg) == []
    assert msg["text"] and len(msg["blocks"]) <= MAX_BLOCKS
    kinds = [b["type"] for b in msg["blocks"]]
    assert kinds[0] == "header" and "actions" in kinds
    actions = [b for b in msg["blocks"] if b["type"] == "actions"][0]
    assert [e["action_id"] for e in actions["elements"]] == [
        "launch_cheapest",
        "launch_safest",
        "cancel_estimate",
    ]
    assert actions["elements"][0]["confirm"]["title"]["text"] == "Launch on the cheapest offer?"
    assert actions["elements"][0]["value"] == "e123"


def test_everything_oversized_is_clipped() -> None:
    huge = "x" * 10_000
    reply = Reply(
        parts=[
            Header(huge),
            Text(huge * 3),
            Fields([(huge, huge)] * 25),
            Table(["a", "b"], [[huge, str(i)] for i in range(500)], title=huge),
            Context([huge] * 25),
            Buttons([Button(huge, "a" * 400, huge, confirm=Confirm(huge, huge, ok=huge, deny=huge))]),
        ]
        + [Text(f"t{i}") for i in range(80)]
        + [Buttons([Button("ok", "keep_me")])]
    )
    msg = to_message(reply)
    assert violations(msg) == []
    assert len(msg["blocks"]) == MAX_BLOCKS
    assert msg["blocks"][0]["type"] == "header"
    assert msg["blocks"][-1]["elements"][0]["action_id"] == "keep_me"  # buttons survive truncation
    assert any("more blocks not shown" in str(b) for b in msg["blocks"])


def test_violations_catches_bad_payloads() -> None:
    bad = {"blocks": [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}] * 51}
    problems = violations(bad)
    assert "51 blocks > 50" in problems
    assert "blocks without a text fallback" in problems
    assert any("header > 150" in p for p in problems)


def test_home_view_allows_100_blocks() -> None:
    reply = Reply(parts=[Text(f"line {i}") for i in range(120)])
    view = to_home_view(reply)
    assert view["type"] == "home" and len(view["blocks"]) == 100 and not violations(view)


def test_duplicate_action_ids_are_dropped() -> None:
    blocks = to_blocks(Reply(parts=[Buttons([Button("a", "x"), Button("b", "x")])]))
    assert len(blocks[0]["elements"]) == 1


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(Header, st.text(max_size=400)),
            st.builds(Text, st.text(max_size=7000)),
            st.builds(Context, st.lists(st.text(max_size=3000), max_size=14)),
            st.builds(Fields, st.lists(st.tuples(st.text(max_size=50), st.text(max_size=2500)), max_size=14)),
            st.builds(
                Table,
                st.just(["a", "b"]),
                st.lists(st.lists(st.text(max_size=80), min_size=2, max_size=2), max_size=60),
            ),
        ),
        max_size=70,
    )
)
def test_fuzz_any_reply_renders_valid(parts) -> None:
    msg = to_message(Reply(parts=parts))
    assert violations(msg) == []
    assert msg["text"]
