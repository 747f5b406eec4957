"""Where jobs may be launched, decided by the engine (issue 19): TUNEBOT_ALLOWED_CHANNELS denies by default,
direct messages included; TUNEBOT_CHANNEL_ALLOW's per-channel lists hold on every door."""

from __future__ import annotations

import pytest

from bot.engine.api import PermissionDenied
from bot.engine.permissions import Permissions
from bot.settings import Settings

from .conftest import estimate_for, request


def test_allowed_channels_deny_every_other_place_including_dms(make_engine, fake):
    policy = Permissions.from_settings(Settings(TUNEBOT_ALLOWED_CHANNELS="C_ML", TUNEBOT_ADMINS="boss"))
    eng = make_engine(permissions=policy)
    for who, channel, where in (
        ("mallory", "D0MALLORY", "in direct messages"),
        ("mallory", "C_RANDOM", "in this channel"),
        ("boss", "D0BOSS", "in direct messages"),  # it says where jobs live: admins too
        ("mallory", "", "in direct messages"),  # a Slack request that names no channel is on no list
    ):
        with pytest.raises(PermissionDenied, match=f"launching {where} is not allowed here"):
            eng.create_job(request(), user=who, channel=channel, estimate=estimate_for(fake))
    assert fake.creates == 0 and eng.list_jobs() == []
    assert (
        eng.create_job(request(), user="mallory", channel="C_ML", estimate=estimate_for(fake)).state
        == "running"
    )
    assert eng.create_job(request(), user="ops", channel=None, estimate=estimate_for(fake)).state == "running"


def test_dm_in_the_list_allows_direct_messages_only(make_engine, fake):
    eng = make_engine(permissions=Permissions.from_settings(Settings(TUNEBOT_ALLOWED_CHANNELS="C_ML, dm")))
    assert eng.create_job(request(), user="alice", channel="D0ALICE", estimate=estimate_for(fake)).job_id
    with pytest.raises(PermissionDenied):
        eng.create_job(request(), user="alice", channel="C_RANDOM", estimate=estimate_for(fake))


def test_per_channel_user_lists_are_the_engines_rule_too(make_engine, fake):
    """a9605e4: TUNEBOT_CHANNEL_ALLOW was checked only by the chat; an engine call launched anywhere."""
    eng = make_engine(permissions=Permissions(channel_allow={"C_GPU": frozenset({"alice"})}))
    with pytest.raises(PermissionDenied, match="allow list"):
        eng.create_job(request(), user="bob", channel="C_GPU", estimate=estimate_for(fake))
    assert eng.create_job(request(), user="alice", channel="C_GPU", estimate=estimate_for(fake)).job_id


def test_start_up_warnings_say_who_may_approve_and_where_members_launch():
    bare = Permissions.from_settings(Settings(TUNEBOT_ADMINS="", TUNEBOT_ALLOWED_CHANNELS=""))
    text = " ".join(bare.startup_warnings())
    assert "TUNEBOT_ADMINS is not set: no member may approve a job in Slack" in text
    assert "the operator runs `tunebot approve JOB`" in text
    assert "no member sets budgets (the operator does: `tunebot budget set ...`)" in text
    assert "TUNEBOT_ALLOWED_CHANNELS is not set" in text and "direct messages" in text
    assert "TUNEBOT_HUB_NAMESPACES is not set: push_to_hub is refused" in text
    configured = Permissions.from_settings(
        Settings(TUNEBOT_ADMINS="U1", TUNEBOT_ALLOWED_CHANNELS="C1", TUNEBOT_HUB_NAMESPACES="acme")
    )
    assert configured.startup_warnings() == []
