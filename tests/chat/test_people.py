"""People by name: users.info (served by the fake Web API) behind a cache, and what Slack users see."""

from __future__ import annotations

from fakes.slack_api import FakeSlack
from fakes.worlds import SlackStack
from slack_sdk import WebClient

from bot.chat.people import People

from .test_slack_http import launch_job

ALICE, BOB = "UALICE0001", "UBOB00002"


def test_names_come_from_users_info_once_per_person() -> None:
    with FakeSlack() as slack:
        people = People.slack(WebClient(token="xoxb-test", base_url=slack.api_url))
        assert people(ALICE) == "alice"  # the display name
        assert people(BOB) == "Bob Stone"  # no display name: the real name
        assert people("UNOBODY99") == "UNOBODY99"  # users.info says user_not_found: the id will do
        assert people("console") == "console"  # not a Slack id: never looked up
        for _ in range(5):
            assert people(ALICE) == "alice"
        asked = [c.body.get("user") for c in slack.of("users.info")]
        assert sorted(asked) == sorted([ALICE, BOB, "UNOBODY99"])  # cached: one call per person


def test_a_failing_lookup_gives_the_id_and_is_retried_later() -> None:
    now = [0.0]
    calls: list[str] = []

    def lookup(user: str) -> dict | None:
        calls.append(user)
        if len(calls) == 1:
            raise ConnectionError("Slack is down")
        return {"profile": {"display_name": "alice"}}

    people = People(lookup, miss_ttl_s=60, clock=lambda: now[0])
    assert people(ALICE) == ALICE
    assert people(ALICE) == ALICE and len(calls) == 1  # not asked again at once
    now[0] = 61
    assert people(ALICE) == "alice" and len(calls) == 2


def _strings(obj: object) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def test_slack_shows_people_not_ids(slack_stack: SlackStack) -> None:
    stack = slack_stack
    launch_job(stack, user=ALICE)
    n = len(stack.slack.of("response"))
    stack.command("jobs all", user=ALICE)  # a member sees their own jobs (issue 28)
    jobs = stack.responses(n + 1)[-1]
    (table,) = [b for b in jobs["blocks"] if b["type"] == "table"]
    owner = table["rows"][1][2]
    assert owner["type"] == "rich_text"
    assert {"type": "user", "user_id": ALICE} in owner["elements"][0]["elements"]
    # the id appears only inside user elements (Slack renders those as the member's name)
    assert not [s for s in _strings(jobs["blocks"]) if ALICE in s and s != ALICE]
    stack.command(f"spend week <@{BOB}|bob>", user=BOB)  # one's own spend (another's: admins only)
    spend = stack.responses(n + 2)[-1]
    assert spend["blocks"][0]["text"]["text"] == "Spend week for @Bob Stone: $12.50"  # a header: plain text
    assert stack.notifier.drain()
    card = stack.slack.of("chat.postMessage")[0].body
    assert f"owner <@{ALICE}>" in str(card["blocks"])  # mrkdwn: a live mention, rendered as the name
