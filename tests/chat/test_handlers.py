"""Command -> engine -> reply: friendly errors, idempotent launches, permissions, never a traceback."""

from __future__ import annotations

import logging
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.chat.blockkit import to_message, violations
from bot.chat.handlers import GENERIC_ERROR, Actor, ChatHandlers
from bot.chat.permissions import Permissions
from bot.chat.replies import Buttons, Reply

from .fake_engine import LEAKY_SECRET, FakeEngine

ALICE = Actor("U_ALICE", "C1")
BOB = Actor("U_BOB", "C1")
ADMIN = Actor("U_ADMIN", "C1")


def flat(reply: Reply) -> str:
    return to_message(reply)["text"] + str(to_message(reply)["blocks"])


def handlers(engine: FakeEngine, **kw) -> ChatHandlers:
    return ChatHandlers(
        engine, Permissions(admins=frozenset({"U_ADMIN"}), **kw), secrets=["xoxb-SECRET-IN-EXCEPTION"]
    )


def estimate_id(reply: Reply) -> str:
    buttons = [b for p in reply.parts if isinstance(p, Buttons) for b in p.buttons]
    return buttons[0].value


def test_estimate_shows_breakdown_offers_and_launch_buttons(engine: FakeEngine) -> None:
    reply = handlers(engine).handle_text("estimate Llama-3.1-8B method=qlora", ALICE)
    text = flat(reply)
    assert "Llama-3.1-8B" in text and "17.2 GB" in text and "weights 5.7 GB" in text
    assert "cheapest" in text and "$1.00" in text
    actions = [b.action for b in reply.buttons]
    assert actions == ["launch_cheapest", "launch_safest", "cancel_estimate"]
    assert all(b.confirm for b in reply.buttons[:2])
    assert not violations(to_message(reply))


def test_launch_button_twice_creates_one_job(engine: FakeEngine) -> None:
    h = handlers(engine)
    eid = estimate_id(h.handle_text("launch Llama-3.1-8B", ALICE))
    first = h.launch(eid, "cheapest", ALICE)
    second = h.launch(eid, "safest", ALICE)
    assert "Launching job *j1*" in flat(first)
    assert "Already launched as job *j1*" in flat(second)
    assert len(engine.jobs) == 1
    assert engine.create_calls[0]["key"] == f"estimate:{eid}"


def test_concurrent_double_click_launches_once(engine: FakeEngine) -> None:
    h = handlers(engine)
    eid = estimate_id(h.handle_text("estimate m", ALICE))
    threads = [threading.Thread(target=h.launch, args=(eid, "cheapest", ALICE)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(engine.jobs) == 1


def test_cancelled_and_expired_estimates_do_not_launch(engine: FakeEngine) -> None:
    h = handlers(engine)
    eid = estimate_id(h.handle_text("estimate m", ALICE))
    assert "Cancelled" in flat(h.cancel_estimate(eid, ALICE))
    assert "cancelled" in flat(h.launch(eid, "cheapest", ALICE))
    assert "expired" in flat(h.launch("e-unknown", "cheapest", ALICE))
    assert not engine.jobs


def test_expensive_job_asks_for_approval_and_owner_cannot_self_approve(engine: FakeEngine) -> None:
    h = handlers(engine)
    eid = estimate_id(h.handle_text("estimate expensive", ADMIN))
    reply = h.launch(eid, "cheapest", ADMIN)
    assert "approval amount" in flat(reply)
    job_id = next(iter(engine.jobs))
    assert "cannot approve your own job" in flat(h.approve(job_id, ADMIN))
    assert "only admins approve" in flat(h.approve(job_id, BOB))
    assert engine.jobs[job_id].state == "pending_approval"
    eid2 = estimate_id(h.handle_text("estimate expensive", ALICE))
    h.launch(eid2, "cheapest", ALICE)
    job2 = [j for j in engine.jobs.values() if j.owner == "U_ALICE"][0]
    assert "approved job" in flat(h.approve(job2.job_id, ADMIN))
    assert engine.jobs[job2.job_id].state == "approved"
    assert "nothing to approve" in flat(h.approve(job2.job_id, ADMIN))


def test_stop_needs_owner_or_admin(engine: FakeEngine) -> None:
    h = handlers(engine)
    h.launch(estimate_id(h.handle_text("estimate m", ALICE)), "cheapest", ALICE)
    assert "only the job's owner or an admin" in flat(h.handle_text("stop j1", BOB))
    assert engine.jobs["j1"].state == "launching"
    assert "Stopping job *j1*" in flat(h.handle_text("stop j1", ADMIN))
    assert engine.jobs["j1"].state == "stopped"


def test_channel_allow_list_limits_launch(engine: FakeEngine) -> None:
    h = handlers(engine, channel_allow={"C1": frozenset({"U_ALICE"})})
    assert "allow list" in flat(h.handle_text("launch m", BOB))
    eid = estimate_id(h.handle_text("estimate m", BOB))
    assert "allow list" in flat(h.launch(eid, "cheapest", BOB))
    assert not engine.jobs
    assert "Launching" in flat(h.launch(eid, "cheapest", ALICE))


def test_budget_set_is_for_admins(engine: FakeEngine) -> None:
    h = handlers(engine)
    assert "only admins set budgets" in flat(h.handle_text("budget set user U_BOB daily=5", BOB))
    assert "daily $5.00" in flat(h.handle_text("budget set user U_BOB daily=5", ADMIN))
    assert "U_BOB" in flat(h.handle_text("budget", BOB))


def test_spend_volumes_jobs_status_help(engine: FakeEngine) -> None:
    h = handlers(engine)
    assert "$12.50" in flat(h.handle_text("spend week", ALICE))
    assert "llama-ckpts" in flat(h.handle_text("volumes", ALICE))
    assert "none" in flat(h.handle_text("jobs", ALICE))
    assert "no job j9" in flat(h.handle_text("status j9", ALICE))
    assert "/tune estimate MODEL" in flat(h.handle_text("help", ALICE))
    gpus = flat(h.handle_text("gpus", ALICE))  # no cloud key in the fake engine: the dated snapshot, said so
    assert "rtx-4090" in gpus and "snapshot as of" in gpus and "vast: no VAST_API_KEY" in gpus
    assert "h100-80gb" in flat(h.handle_text("gpus H100", ALICE))
    assert ":warning:" in flat(h.handle_text("gpus banana", ALICE))


def test_errors_are_friendly_and_secret_free(engine: FakeEngine, caplog) -> None:
    h = handlers(engine)
    unknown = flat(h.handle_text("estimate no-such-model", ALICE))
    assert "did you mean Llama-3.1-8B" in unknown
    with caplog.at_level(logging.ERROR):
        boom = flat(h.handle_text("estimate explode", ALICE))
    assert GENERIC_ERROR in boom
    assert "Traceback" not in boom and "SECRET" not in boom and "RuntimeError" not in boom
    logged = [r.getMessage() for r in caplog.records if "chat command failed" in r.getMessage()]
    assert logged and "RuntimeError" in logged[0]  # the traceback is logged ...
    assert LEAKY_SECRET not in caplog.text  # ... scrubbed
    leaky = flat(h.handle_text("estimate leaky", ALICE))
    assert "provider refused key ***" in leaky and "SECRET" not in leaky
    bad = flat(h.handle_text("estimate m seq=1", ALICE))
    assert "seq:" in bad and "/tune estimate MODEL" in bad


def test_volume_buttons(engine: FakeEngine) -> None:
    h = handlers(engine)
    assert "only the volume's owner" in flat(h.volume_action("runpod:vol-1", "delete", BOB))
    assert engine.deleted == []
    assert "deleted volume *llama-ckpts*" in flat(h.volume_action("runpod:vol-1", "delete", ALICE))
    assert engine.deleted == ["vol-1"]
    assert "not valid" in flat(h.volume_action("garbage", "delete", ALICE))


def test_home_shows_jobs_and_month_spend(engine: FakeEngine) -> None:
    h = handlers(engine)
    h.launch(estimate_id(h.handle_text("estimate m", ALICE)), "cheapest", ALICE)
    home = flat(h.home("U_ALICE"))
    assert "j1" in home and "$10.00" in home


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=120))
def test_fuzz_handle_never_raises_or_leaks(text: str) -> None:
    h = handlers(FakeEngine())
    reply = h.handle_text(text, ALICE)
    out = flat(reply)
    assert "Traceback" not in out
    assert not violations(to_message(reply))


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(
        ["estimate", "launch", "status", "stop", "spend", "budget set user", "jobs", "gpus", "volumes"]
    ),
    st.lists(
        st.sampled_from(
            [
                "m",
                "explode",
                "no-such-model",
                "j1",
                "seq=9",
                "r=x",
                "U1",
                "daily=3",
                "all",
                "tokens=2B",
                "<@U9>",
                "week",
                "\u00e9",
                "max_cost=1",
            ]
        ),
        max_size=5,
    ),
)
def test_fuzz_commands_never_raise(name: str, args: list[str]) -> None:
    reply = handlers(FakeEngine()).handle_text(" ".join([name, *args]), ALICE)
    assert "Traceback" not in flat(reply)
