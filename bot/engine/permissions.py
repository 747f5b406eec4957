"""Who may launch, approve, stop other people's jobs and set budgets: the one policy.

The engine enforces it on every call (whatever the surface: Slack, console, CLI) and the chat layer
asks the same object first so that it can answer with the reason instead of an error.

Admins come from TUNEBOT_ADMINS; per-channel allow lists from TUNEBOT_CHANNEL_ALLOW
("C1=U1|U2;C2=U3": only those users launch in those channels, everyone elsewhere). Nobody approves
their own job. Where admins are configured, only admins approve and set budgets; an install with
no admins at all (one person on the CLI or the console) lets anyone else approve and anyone set
budgets. The engine itself ("engine") may always stop a job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bot.settings import Settings

MAX_RUNNING_PER_USER = 4  # the settings' default (TUNEBOT_MAX_RUNNING_PER_USER)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.allowed


def _parse_allow(text: str) -> dict[str, frozenset[str]]:
    rules: dict[str, frozenset[str]] = {}
    for chunk in text.replace(",", ";").split(";"):
        channel, sep, users = chunk.partition("=")
        if sep and channel.strip():
            rules[channel.strip()] = frozenset(u.strip() for u in users.split("|") if u.strip())
    return rules


@dataclass(frozen=True)
class Permissions:
    admins: frozenset[str] = frozenset()
    channel_allow: dict[str, frozenset[str]] = field(default_factory=dict)
    approval_above: float = 50.0
    max_running_per_user: int = MAX_RUNNING_PER_USER

    @classmethod
    def from_settings(cls, settings: Settings, *, extra_admins: tuple[str, ...] = ()) -> Permissions:
        admins = {a.strip() for a in settings.admins.split(",") if a.strip()} | set(extra_admins)
        return cls(
            admins=frozenset(admins),
            channel_allow=_parse_allow(settings.channel_allow),
            approval_above=settings.approval_above_usd,
            max_running_per_user=settings.max_running_per_user,
        )

    def is_admin(self, user: str) -> bool:
        return user in self.admins

    def can_launch(self, user: str, channel: str | None) -> Decision:
        if self.is_admin(user):
            return Decision(True)
        allowed = self.channel_allow.get(channel or "")
        if allowed is not None and user not in allowed:
            return Decision(False, "launching in this channel is limited to its allow list; ask an admin")
        return Decision(True)

    def needs_approval(self, amount: float | None) -> bool:
        """Whether a job that may cost ``amount`` (the higher of its estimate and explicit max_cost, or a
        pricier fallback's projection; bot/engine/approval.py) needs a person's approval."""
        return amount is not None and amount > self.approval_above

    def can_approve(self, user: str, owner: str, *, amount: float | None = None) -> Decision:
        """Approve (or reject) a job waiting for approval. ``amount``: what it may cost (the higher of its
        estimate and cap); the owner may confirm only an amount they could have launched unapproved
        (a fallback held only because it is above the job's own cap)."""
        if user == owner and (amount is None or self.needs_approval(amount)):
            return Decision(False, "you cannot approve your own job; another admin has to")
        if self.admins and not self.is_admin(user):
            return Decision(False, "only admins approve jobs")
        return Decision(True)

    def can_stop(self, user: str, owner: str) -> Decision:
        if user in (owner, ENGINE) or self.is_admin(user):
            return Decision(True)
        return Decision(False, "only the job's owner or an admin may stop it")

    def can_manage_volume(self, user: str, *, owner: str | None, tracked: bool) -> Decision:
        """Delete or keep a volume: only one tunebot created or attached (tracked, with the owner of its
        job recorded), and only its owner or an admin. A provider's other volumes are never tunebot's to
        delete, whoever asks."""
        if not tracked:
            return Decision(
                False,
                "tunebot did not create or attach this volume, so it neither deletes nor keeps it; "
                "manage it in the provider's console",
            )
        if (owner and user == owner) or self.is_admin(user):
            return Decision(True)
        return Decision(False, "only the volume's owner or an admin may do that")

    def can_run_another(self, user: str, running: int) -> Decision:
        """Start one more job while ``running`` of the user's are running or about to (0 = no limit)."""
        limit = self.max_running_per_user
        if limit and running >= limit:
            return Decision(
                False,
                f"{user} already has {running} job(s) running or starting, the most one person may run at "
                f"once ({limit}, TUNEBOT_MAX_RUNNING_PER_USER); stop one or wait for one to end",
            )
        return Decision(True)

    def who_raises_budgets(self) -> str:
        """Who can raise a spent budget, for the refusal that names it."""
        if self.admins:
            return f"an admin ({', '.join(sorted(self.admins))})"
        return "anyone (no TUNEBOT_ADMINS is set)"

    def can_set_budget(self, user: str) -> Decision:
        if not self.admins or self.is_admin(user):
            return Decision(True)
        return Decision(False, "only admins set budgets")


ENGINE = "engine"  # the engine's own actor name (idle stops, budget caps)
