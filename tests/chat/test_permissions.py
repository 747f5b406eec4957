"""Permissions: admins, channel allow lists, no self-approval."""

from __future__ import annotations

from bot.chat.permissions import Permissions
from bot.engine.permissions import ENGINE, OPERATOR
from bot.settings import Settings


def test_from_settings_reads_admins_and_allow_lists(monkeypatch) -> None:
    monkeypatch.setenv("TUNEBOT_ADMINS", "U1, U2")
    monkeypatch.setenv("TUNEBOT_CHANNEL_ALLOW", "C1=U3|U4;C2=U5")
    monkeypatch.setenv("TUNEBOT_APPROVAL_ABOVE", "20")
    p = Permissions.from_settings(Settings())
    assert p.admins == {"U1", "U2"}
    assert p.channel_allow == {"C1": {"U3", "U4"}, "C2": {"U5"}}
    assert p.approval_above == 20.0
    assert p.can_launch("U3", "C1") and not p.can_launch("U5", "C1")
    assert p.can_launch("U1", "C1")  # admins always may
    assert p.can_launch("U9", "C-unlisted")
    assert p.needs_approval(25) and not p.needs_approval(20) and not p.needs_approval(None)


def test_approval_and_stop_rules() -> None:
    p = Permissions(admins=frozenset({"A"}))
    assert not p.can_approve("A", "A")
    assert "own job" in p.can_approve("A", "A").reason
    assert not p.can_approve("B", "C")
    assert p.can_approve("A", "C")
    assert p.can_stop("B", "B") and p.can_stop("A", "B") and not p.can_stop("C", "B")
    assert p.can_set_budget("A") and not p.can_set_budget("B")
    bare = Permissions()  # no admins: the operator alone sets budgets (issue 28)
    assert bare.can_set_budget(OPERATOR) and not bare.can_set_budget("B") and not bare.can_set_budget(ENGINE)
    assert (
        "the operator sets budgets on the bot's machine: `tunebot budget set"
        in bare.can_set_budget("B").reason
    )
