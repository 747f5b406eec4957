"""User text never becomes a live Slack token: a property test over every renderer that shows it.

Whatever a person typed (or a file, a provider or a budget name carried) goes through bot/chat/escaping.py;
the only live tokens in a rendered message are the mentions the bot itself builds for real user ids.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from bot.chat import cards
from bot.chat.blockkit import to_home_view, to_message
from bot.chat.dashboard import home_reply
from bot.chat.escaping import esc, live_tokens, mention, unescape
from bot.chat.grammar import ParseError, parse
from bot.chat.handlers import Actor, ChatHandlers
from bot.chat.notifier import milestone_text
from bot.chat.replies import error_reply
from bot.chat.terminal import render
from bot.engine.api import BudgetView, Dashboard, JobView, SpendLine, SpendPace, SpendReport, VolumeView
from bot.engine.events import EngineEvent, EngineEventKind

from .fake_engine import FakeEngine, make_estimate

HOSTILE = [
    "<!channel>",
    "<!here>",
    "<!everyone>",
    "<@U0HOSTILE>",
    "<@U0HOSTILE|boss>",
    "<!subteam^S0HOSTILE>",
    "<!subteam^S0HOSTILE|@team>",
    "<https://evil.example/x|click me>",
    "<mailto:a@evil.example|mail>",
    "<#C0HOSTILE>",
    "&lt;!channel&gt;",
    "&amp;lt;!here&amp;gt;",
]
OURS = {"<@U0OWNER>", "<@U0ADMIN>"}  # mentions the bot builds from real ids
user_text = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12)), min_size=1, max_size=5).map(
    "".join
)
NOW = datetime(2026, 12, 3, tzinfo=UTC)


def strings(obj: object) -> list[str]:
    """Every string in a Slack payload (texts, fallbacks, button labels, confirm dialogs)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings(v)]
    if isinstance(obj, list | tuple):
        return [s for v in obj for s in strings(v)]
    return []


def assert_no_live_user_tokens(payload: dict) -> None:
    for text in strings(payload):
        stray = [t for t in live_tokens(text) if t not in OURS]
        assert not stray, (stray, text)


def job(text: str, **kw: object) -> JobView:
    return JobView(
        job_id="j1",
        owner="U0OWNER",
        state="failed",
        model=text,
        method="lora",
        provider=text[:20] or "vast",
        gpu=text[:10],
        message=text,
        output_uri=text,
        created_at=NOW,
        updated_at=NOW,
        **kw,
    )


def volume(text: str, *, owner: str) -> VolumeView:
    return VolumeView(
        provider="vast",
        volume_id="v1",
        name=text,
        size_gb=10,
        price_per_gb_month=0.1,
        cost_per_month=1.0,
        cost_so_far=0.5,
        owner=owner,
        tracked=True,
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=user_text)
@example(text="<@U0HOSTILE|boss> <!channel> <https://evil.example|x> <!subteam^S0X>")
def test_no_renderer_lets_user_text_become_a_live_token(text: str) -> None:
    replies = [
        error_reply(f"unknown model {text!r}", "usage"),
        cards.job_card(job(text)),
        cards.jobs_reply([job(text)], title="Your jobs"),
        cards.jobs_reply([job(text, stop_reason=text)], title="Jobs", detailed=True, limit=None),
        cards.approval_request(job(text), approvers=["U0ADMIN"], threshold=50),
        home_reply(
            Dashboard(
                user="U0OWNER",
                is_admin=True,
                at=NOW,
                month_start=NOW,
                days_in_month=31,
                mine=[job(text)],
                running=[job(text).model_copy(update={"state": "running"})],
                people=[SpendPace(scope="user", name=text, month_to_date=1.0)],
                teams=[SpendPace(scope="team", name=text, month_to_date=1.0)],
                idle_volumes=[volume(text, owner=text)],
                manageable=["vast:v1"],
            )
        ),
        cards.spend_reply(
            SpendReport(
                period="week",
                start=NOW,
                end=NOW,
                total=2.0,
                by_user=[SpendLine(key=text, amount=1.0)],
                by_provider=[],
                by_job=[SpendLine(key=text, amount=1.0)],
            ),
            user="U0OWNER",
        ),
        cards.volumes_reply([volume(text, owner=text)]),
        cards.volume_reminder(volume(text, owner="U0OWNER"), message=text),
        cards.budgets_reply([BudgetView(scope="team", name=text, daily=1.0, monthly=2.0)]),
        cards.estimate_reply(make_estimate(text), estimate_id="e1", launching=True),
        cards.estimate_reply(make_estimate(text), estimate_id=None, detailed=True),
    ]
    for kind in (
        EngineEventKind.failed,
        EngineEventKind.stopped,
        EngineEventKind.job_started,
        EngineEventKind.finished,
        EngineEventKind.link,
        EngineEventKind.preempted,
    ):
        event = EngineEvent(kind=kind, job_id="j1", message=text, data={"note": text, "url": text})
        line = milestone_text(event, job(text))
        assert_no_live_user_tokens({"text": line})
    for reply in replies:
        assert_no_live_user_tokens(to_message(reply))
        assert_no_live_user_tokens(to_home_view(reply))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=user_text)
@example(text="<@U0HOSTILE>")
@example(text="<!here> <https://evil.example|x>")
def test_commands_typed_by_a_person_never_echo_live_tokens(text: str) -> None:
    """The ack, the parse error and the full answer of /tune commands with hostile words in every slot."""
    chat = ChatHandlers(FakeEngine(), secrets=[])
    actor = Actor("U0OWNER", "C1")
    quoted = json.dumps(text)
    for line in (
        f"estimate {quoted}",
        f"launch {quoted} seq={quoted}",
        f"status {quoted}",
        f"{quoted}",
        f"spend {quoted}",
        f"budget set team {quoted} daily=5",
        f"gpus {quoted}",
        f"stop {quoted}",
    ):
        try:
            command = parse(line)
        except ParseError as exc:
            assert_no_live_user_tokens(to_message(error_reply(exc.message, exc.usage)))
            continue
        ack = chat.quick_ack(command)
        assert_no_live_user_tokens({"text": ack or ""})
        assert_no_live_user_tokens(to_message(chat.handle(command, actor)))


def test_escaping_rules_and_the_terminal_shows_the_characters() -> None:
    assert esc("a & <b> > c") == "a &amp; &lt;b&gt; &gt; c"
    assert unescape(esc("<!channel> & &lt;")) == "<!channel> & &lt;"
    assert mention("U0OWNER") == "<@U0OWNER>" and mention("console") == "@console"
    assert mention("<!channel>") == "@&lt;!channel&gt;"
    console = Console(record=True, width=200)
    render(cards.job_card(job("model <!here> & co")), console)
    out = console.export_text()
    assert "model <!here> & co" in out and "&lt;" not in out
