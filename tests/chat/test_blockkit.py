"""Block Kit rendering stays inside Slack's limits and always has a text fallback."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.chat import cards
from bot.chat.blockkit import MAX_BLOCKS, to_blocks, to_home_view, to_message, violations
from bot.chat.replies import Button, Buttons, Confirm, Context, Fields, Header, Reply, Table, Text
from bot.engine.api import SpendLine, SpendReport

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


def _table(message: dict) -> dict:
    (table,) = [b for b in message["blocks"] if b["type"] == "table"]
    return table


def _cell_text(cell: dict) -> str:
    if cell["type"] == "raw_text":
        return cell["text"]
    return "".join(
        e.get("text") or f"<user {e.get('user_id')}>" for s in cell["elements"] for e in s["elements"]
    )


def test_offers_are_a_table_block_with_a_header_row_and_numbers_on_the_right() -> None:
    from slack_sdk.models.blocks import Block

    msg = to_message(cards.estimate_reply(make_estimate(n_offers=400), estimate_id="e1", launching=True))
    table = _table(msg)
    header = [_cell_text(c) for c in table["rows"][0]]
    assert header == cards.OFFER_COLUMNS
    assert all(c["type"] == "rich_text" for c in table["rows"][0])  # bold header cells
    assert 2 <= len(table["rows"]) <= 100 and {len(r) for r in table["rows"]} == {len(header)}
    align = {h: s["align"] for h, s in zip(header, table["column_settings"], strict=True)}
    assert align["$/h"] == align["total"] == align["#"] == "right" and align["provider"] == "left"
    assert "```" not in str(msg["blocks"])  # no monospace tables any more
    assert Block.parse(table).to_dict()["type"] == "table"  # slack_sdk's own model reads it back
    assert violations(msg) == []


def test_people_in_table_cells_are_user_elements_and_one_table_per_message() -> None:
    report = SpendReport(
        period="month",
        start=datetime(2026, 12, 1, tzinfo=UTC),
        end=datetime(2026, 12, 3, tzinfo=UTC),
        total=3.0,
        by_user=[SpendLine(key="UALICE0001", amount=2.0, budget=10.0)],
        by_provider=[SpendLine(key="vast", amount=3.0)],
        by_job=[SpendLine(key="j1", amount=3.0)],
    )
    msg = to_message(cards.spend_reply(report))
    table = _table(msg)  # the first table is a table block, the others section fields (one per message)
    person = table["rows"][1][0]
    assert person["type"] == "rich_text"
    assert person["elements"][0]["elements"] == [{"type": "user", "user_id": "UALICE0001"}]
    assert "vast" in str(msg["blocks"]) and violations(msg) == []
    # App Home has no table blocks: the same reply as section fields, the person as a mention
    view = to_home_view(cards.spend_reply(report))
    assert not [b for b in view["blocks"] if b["type"] == "table"] and violations(view) == []
    assert "<@UALICE0001>" in str(view["blocks"])


def test_plain_text_places_show_names_instead_of_mentions() -> None:
    reply = cards.spend_reply(
        SpendReport(
            period="week",
            start=datetime(2026, 12, 1, tzinfo=UTC),
            end=datetime(2026, 12, 3, tzinfo=UTC),
            total=1.0,
            by_user=[],
            by_provider=[],
            by_job=[],
        ),
        user="UBOB00002",
    )
    names = {"UBOB00002": "Bob Stone"}.get
    header = to_message(reply, names=lambda u: names(u) or u)["blocks"][0]
    assert header["text"]["text"] == "Spend week for @Bob Stone: $1.00"
    assert to_message(reply)["blocks"][0]["text"]["text"] == "Spend week for @UBOB00002: $1.00"


def test_violations_catch_bad_tables() -> None:
    raw = {"type": "raw_text", "text": "x"}
    ragged = {"type": "table", "rows": [[raw, raw], [raw]]}
    assert any("different widths" in p for p in violations({"text": "t", "blocks": [ragged]}))
    tall = {"type": "table", "rows": [[raw]] * 101}
    assert any("101 table rows" in p for p in violations({"text": "t", "blocks": [tall]}))
    wide = {"type": "table", "rows": [[raw] * 21]}
    assert any("more than 20 cells" in p for p in violations({"text": "t", "blocks": [wide]}))
    ok = {"type": "table", "rows": [[raw]]}
    assert any("2 table blocks" in p for p in violations({"text": "t", "blocks": [ok, ok]}))
    assert any("table block in a home" in p for p in violations({"type": "home", "blocks": [ok]}))
    odd = {"type": "table", "rows": [[{"type": "mrkdwn", "text": "x"}]]}
    assert any("cell of type 'mrkdwn'" in p for p in violations({"text": "t", "blocks": [odd]}))
