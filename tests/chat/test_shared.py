"""Shared where it helps: an estimate stays with the person who asked; once launched, the job's card and
its thread are in the channel where it was launched, for the whole team (or the owner's DM when the bot
cannot post there)."""

from __future__ import annotations

from fakes.worlds import SlackStack, estimate_id_from

ALICE = "UALICE0001"


def test_the_estimate_is_private_and_the_launched_job_is_the_channels(slack_stack: SlackStack) -> None:
    stack = slack_stack
    assert stack.command("estimate Llama-3.1-8B", user=ALICE, channel="C_TEAM").status_code == 200
    estimate = stack.responses(1)[0]
    assert estimate["response_type"] == "ephemeral"  # only the asker sees an estimate
    assert not stack.slack.of("chat.postMessage")  # nothing in the channel yet
    stack.click(
        stack.action_payload("launch_cheapest", estimate_id_from(estimate), user=ALICE, channel="C_TEAM")
    )
    launched = stack.responses(2)[1]
    assert launched["replace_original"] is True and "Launching job *j1*" in launched["text"]
    assert stack.notifier.drain()
    (card,) = stack.slack.of("chat.postMessage")
    assert card.body["channel"] == "C_TEAM" and "thread_ts" not in card.body  # a message of the channel
    assert f"owner <@{ALICE}>" in str(card.body["blocks"]) and not stack.slack.of("chat.postEphemeral")
    assert stack.engine.threads["j1"][0] == "C_TEAM"


def test_a_channel_the_bot_cannot_post_in_gets_the_thread_in_the_owners_dm(slack_stack: SlackStack) -> None:
    stack = slack_stack
    stack.slack.not_in.add("G_PRIVATE")
    stack.command("estimate Llama-3.1-8B", user=ALICE, channel="G_PRIVATE")
    eid = estimate_id_from(stack.responses(1)[0])
    stack.click(stack.action_payload("launch_cheapest", eid, user=ALICE, channel="G_PRIVATE"))
    stack.responses(2)
    assert stack.notifier.drain()
    posts = [c.body for c in stack.slack.of("chat.postMessage")]
    # tried the channel first (Slack answered not_in_channel), then the owner's DM
    assert [p["channel"] for p in posts] == ["G_PRIVATE", f"D{ALICE}", f"D{ALICE}"]
    assert "invite tunebot there" in posts[1]["text"] and "Job j1" in posts[2]["text"]
    assert stack.engine.threads["j1"][0] == f"D{ALICE}"  # milestones and card edits follow it there
