"""Every door checks the viewer before it answers (issue 38, item 2): a member who may not see a job, a sweep
or a volume gets word for word the answer for one that does not exist.

Played on 9a0c9c1 as Mallory, a member, against Alice's job, sweep and volume: `compare sw-...` listed the
sweep's runs' job ids; `stop JOB` and `stop sw-...` answered "only alice or an admin can stop ..."; `status`,
`approve`, `resume`, `clone` and the volume buttons each told "another member's" (or the reason they may not
act) where an unknown id got "no job" - so any answer told that the thing exists, and some whose it is.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakes.worlds import console_text

from bot.engine.permissions import Permissions
from bot.providers.base import Capabilities, Volume

from .conftest import estimate_for, request

GRID = {"learning_rate": [1e-4, 2e-4], "lora_r": [8, 16]}
NO_JOB, NO_SWEEP = "0123456789ab", "sw-0123456789"


def _said(chat: Any, verb: str, ref: str, who: str) -> str:
    """The answer to ``verb`` on ``ref`` as ``who`` says or clicks it, with the reference blanked."""
    from bot.chat.handlers import Actor

    actor = Actor(who)
    buttons = {
        "button stop": chat.stop,
        "button approve": chat.approve,
        "button reject": chat.reject,
        "button resume": chat.resume,
    }
    if verb in buttons:
        reply = buttons[verb](ref, actor)
    elif verb.startswith("volume "):
        reply = chat.volume_action(ref, verb.split()[1], actor)
    else:
        reply = chat.handle_text(verb.replace("REF", ref), actor)
    return console_text(reply).replace(ref.split(":")[-1], "<REF>")


def test_another_members_job_sweep_and_volume_are_answered_as_ones_that_do_not_exist(
    make_engine: Any, fake: Any
) -> None:
    from bot.chat.handlers import ChatHandlers
    from bot.engine.control import sweeps

    policy = Permissions(admins=frozenset({"admin"}), approval_above=50.0, max_running_per_user=0)
    fake.capabilities = Capabilities(interruptible=False, volumes=True, kind="process")
    engine = make_engine(permissions=policy)
    chat = ChatHandlers(engine, policy)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    pending = engine.create_job(request(max_cost=500.0), user="alice", estimate=estimate_for(fake))
    assert pending.state == "pending_approval"
    engine.estimate = lambda req: estimate_for(fake, hours=1.0)
    est = sweeps.estimate_sweep(engine.ctx, engine.estimate, request(max_cost=20.0), GRID)
    sweep = engine.create_sweep(est, user="alice")
    asked = sweeps.estimate_sweep(engine.ctx, engine.estimate, request(max_cost=80.0), GRID)
    waiting = engine.create_sweep(asked, user="alice")
    assert (sweep.state, waiting.state) == ("running", "pending_approval")
    fake.volumes["ckpt"] = Volume(
        provider=fake.name, volume_id="ckpt", name=f"tunebot-{job.job_id}", size_gb=50, price_per_gb_month=0.1
    )
    fake.volumes["prod"] = Volume(
        provider=fake.name, volume_id="prod", name="company-prod-db", size_gb=500, price_per_gb_month=0.1
    )
    listed = {v.volume_id: (v.tracked, v.owner) for v in engine.volumes()}  # as the bot: who owns what
    assert listed == {"ckpt": (True, "alice"), "prod": (False, None)}
    runs = [r.job.job_id for r in engine.get_sweep(sweep.sweep_id).runs if r.job]

    cases = [
        ("status REF", job.job_id, NO_JOB),
        ("stop REF", job.job_id, NO_JOB),
        ("button stop", job.job_id, NO_JOB),
        ("approve REF", pending.job_id, NO_JOB),
        ("button approve", pending.job_id, NO_JOB),
        ("button reject", pending.job_id, NO_JOB),
        ("resume REF", job.job_id, NO_JOB),
        ("button resume", job.job_id, NO_JOB),
        ("clone REF lr=1e-3", job.job_id, NO_JOB),
        (f"compare REF {runs[0]}", runs[1], NO_JOB),
        ("status REF", sweep.sweep_id, NO_SWEEP),
        ("stop REF", sweep.sweep_id, NO_SWEEP),
        ("compare REF", sweep.sweep_id, NO_SWEEP),
        ("approve REF", waiting.sweep_id, NO_SWEEP),
        ("button reject", waiting.sweep_id, NO_SWEEP),
        ("volume delete", f"{fake.name}:ckpt", f"{fake.name}:nope"),
        ("volume keep", f"{fake.name}:prod", f"{fake.name}:nope"),
    ]
    for verb, theirs, missing in cases:
        seen = _said(chat, verb, theirs, "mallory")
        unknown = _said(chat, verb, missing, "mallory")
        assert seen == unknown, (verb, seen, unknown)
        assert "alice" not in seen and not any(r in seen for r in runs), (verb, seen)
    # Nothing was done, and those who may see them still do.
    assert engine.get_job(job.job_id).state == "running"
    assert engine.get_job(pending.job_id).state == "pending_approval"
    assert engine.get_sweep(sweep.sweep_id).state == "running" and not fake.deleted_volumes
    told = _said(chat, "compare REF", sweep.sweep_id, "alice")
    assert all(r in told for r in runs), told
    assert "Stopping job" in _said(chat, "stop REF", job.job_id, "admin")
    assert "did not create or attach" in _said(chat, "volume keep", f"{fake.name}:prod", "admin")


def test_a_stop_a_reader_may_not_make_never_names_the_owner(make_engine: Any, fake: Any) -> None:
    """With TUNEBOT_TEAM_READ a member reads every job and sweep; stopping stays the owner's or an admin's,
    and the refusal says so without naming anyone."""
    from bot.chat.handlers import ChatHandlers
    from bot.engine.control import sweeps

    policy = Permissions(admins=frozenset({"admin"}), team_read=True, max_running_per_user=0)
    engine = make_engine(permissions=policy)
    chat = ChatHandlers(engine, policy)
    job = engine.create_job(request(), user="alice", estimate=estimate_for(fake))
    engine.estimate = lambda req: estimate_for(fake, hours=1.0)
    sweep = engine.create_sweep(
        sweeps.estimate_sweep(engine.ctx, engine.estimate, request(max_cost=20.0), GRID), user="alice"
    )
    for ref in (job.job_id, sweep.sweep_id):
        said = _said(chat, "stop REF", ref, "mallory")
        assert "Not allowed" in said and "owner or an admin" in said and "alice" not in said, said
    from bot.engine.api import PermissionDenied

    for stop in (
        lambda: engine.stop(job.job_id, user="mallory"),
        lambda: engine.stop_sweep(sweep.sweep_id, user="mallory"),
    ):
        with pytest.raises(PermissionDenied) as refused:
            stop()
        assert "alice" not in str(refused.value)
