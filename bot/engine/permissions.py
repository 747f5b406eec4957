"""Who may launch, approve, stop other people's jobs and set budgets: the one policy.

The engine enforces it on every call (whatever the surface: Slack, console, CLI) and the chat layer
asks the same object first so that it can answer with the reason instead of an error.

Where jobs may be launched:
- TUNEBOT_ALLOWED_CHANNELS ("C1,C2", deny by default): when set, Slack launches happen only in the listed
  channels; every other channel, direct messages and group DMs are refused (add ``dm`` to the list to
  allow direct messages with the bot). Admins are bound by it too: it says where jobs and their threads
  live. Unset: any channel and any DM (the start-up warnings say so).
- TUNEBOT_CHANNEL_ALLOW ("C1=U1|U2;C2=U3"): who may launch in a listed channel (admins always may);
  channels it does not list follow TUNEBOT_ALLOWED_CHANNELS.
- A launch with no channel at all (``None``) is the operator's: the console and the CLI. A Slack request
  always names its channel (the chat passes "" where it somehow does not, which no list contains).

Who is who:
- **Members**: the Slack user ids of signed requests. What a member may do is below.
- **Admins**: the ids in TUNEBOT_ADMINS.
- **The operator** (``OPERATOR``, the one identity of the CLI and the console, whose person runs the bot on
  its machine and holds its keys anyway): an admin of this install, whatever TUNEBOT_ADMINS says. Every
  CLI command acts as the operator (``tunebot launch --user NAME`` only names the job's owner); no door
  lets the operator act as a member, and no Slack request can be the operator (its id comes from Slack).
- **The engine** (``ENGINE``): what the bot does on its own (idle stops, budget caps).

Reading (``can_read``, ``sees_everyone``): a member sees their own jobs, their charts and their spend;
admins see everyone's; TUNEBOT_TEAM_READ=1 opens reading (never acting) to every member. Cloning
(``can_clone``): the job's owner or an admin (the clone's data and Hub repo are checked again for the
cloner, as for a new launch).

Approval needs a second person (``can_approve``): a member never approves their own job, whatever the
amount; where admins are configured, only admins approve (and set budgets); with no admins at all, no
member approves: the operator does, on the bot's machine (``tunebot approve JOB``), and the approval
request says so (``approver_hint``). The operator may approve any job, theirs included.
Budgets follow the same rule (``can_set_budget``): admins and the operator set them; with no admins at all,
only the operator does, on the bot's machine (``tunebot budget set ...``), and a member's refusal says so. A
member whose budget stopped their jobs never raises it, nor lowers another's.
Deleting or keeping a volume: only one tunebot tracks, by its owner or an admin. The engine itself may
always stop a job. Spending limits: TUNEBOT_APPROVAL_ABOVE, TUNEBOT_MAX_RUNNING_PER_USER.

Hub pushes go only to the namespaces in TUNEBOT_HUB_NAMESPACES (unset: none), into a repo the job creates
(the bot's push refuses an existing one, runner/contract/publish.py); a public repo needs an admin's approval
(an admin's own job is approved by launching it), so none where no admin is configured.
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


DM = "dm"  # in TUNEBOT_ALLOWED_CHANNELS: direct messages with the bot are allowed too


def _parse_channels(text: str) -> frozenset[str] | None:
    """TUNEBOT_ALLOWED_CHANNELS: None when unset (no channel list), else the ids (and ``dm``)."""
    ids = frozenset(c.strip() for c in text.replace(";", ",").split(",") if c.strip())
    return ids or None


def _is_dm(channel: str) -> bool:
    return channel.startswith("D")  # Slack's direct-message conversation ids


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
    allowed_channels: frozenset[str] | None = None  # None: every channel and DM; else deny by default
    approval_above: float = 50.0
    max_running_per_user: int = MAX_RUNNING_PER_USER
    hub_namespaces: frozenset[str] = frozenset()  # where Hub repos may be created; empty: no pushes
    team_read: bool = False  # TUNEBOT_TEAM_READ: every member reads every job and spend (acting stays theirs)

    @classmethod
    def from_settings(cls, settings: Settings, *, extra_admins: tuple[str, ...] = ()) -> Permissions:
        admins = {a.strip() for a in settings.admins.split(",") if a.strip()} | set(extra_admins)
        return cls(
            admins=frozenset(admins),
            channel_allow=_parse_allow(settings.channel_allow),
            allowed_channels=_parse_channels(settings.allowed_channels),
            approval_above=settings.approval_above_usd,
            max_running_per_user=settings.max_running_per_user,
            hub_namespaces=frozenset(n.strip() for n in settings.hub_namespaces.split(",") if n.strip()),
            team_read=bool(settings.team_read),
        )

    def is_admin(self, user: str) -> bool:
        """An admin: listed in TUNEBOT_ADMINS, or the operator (the CLI and the console on this machine)."""
        return user == OPERATOR or user in self.admins

    def sees_everyone(self, user: str) -> bool:
        """Whether ``user`` reads every member's jobs and spend: admins, the engine, or all with
        TUNEBOT_TEAM_READ."""
        return self.team_read or user == ENGINE or self.is_admin(user)

    def can_read(self, user: str, owner: str) -> Decision:
        """See a job (status, chart, spend line): its owner, an admin, or anyone with TUNEBOT_TEAM_READ."""
        if user == owner or self.sees_everyone(user):
            return Decision(True)
        return Decision(
            False,
            "that job is another member's: only its owner or an admin sees it (TUNEBOT_TEAM_READ=1 opens "
            "reading to the whole team)",
        )

    def can_read_user(self, user: str, whose: str | None) -> Decision:
        """See ``whose`` jobs or spend (None: everyone's)."""
        if whose == user or self.sees_everyone(user):
            return Decision(True)
        what = "everyone's" if whose is None else "another member's"
        return Decision(
            False,
            f"only admins see {what} jobs and spend (TUNEBOT_TEAM_READ=1 opens reading to the whole team)",
        )

    def can_clone(self, user: str, owner: str) -> Decision:
        """Launch a copy of a job (its data, its settings): its owner or an admin; reading is not enough."""
        if user == owner or self.is_admin(user):
            return Decision(True)
        return Decision(False, "only the job's owner or an admin may clone it (it uses their data)")

    def can_launch(self, user: str, channel: str | None) -> Decision:
        """Launch from this channel (None: the operator's console or CLI, not Slack)."""
        if channel is None:
            return Decision(True)
        if self.allowed_channels is not None:
            listed = channel in self.allowed_channels or (DM in self.allowed_channels and _is_dm(channel))
            if not listed:
                where = "in direct messages" if _is_dm(channel) or not channel else "in this channel"
                return Decision(
                    False,
                    f"launching {where} is not allowed here (TUNEBOT_ALLOWED_CHANNELS lists where jobs "
                    "may be launched); launch from one of those channels or ask an admin",
                )
        if self.is_admin(user):
            return Decision(True)
        allowed = self.channel_allow.get(channel)
        if allowed is not None and user not in allowed:
            return Decision(False, "launching in this channel is limited to its allow list; ask an admin")
        return Decision(True)

    def startup_warnings(self) -> list[str]:
        """What an operator should know at start about who may do what (logged by `tunebot serve`)."""
        out = []
        if not self.admins:
            out.append(
                "TUNEBOT_ADMINS is not set: no member may approve a job in Slack (jobs above the approval "
                "amount wait until the operator runs `tunebot approve JOB` on this machine) and no member "
                "sets budgets (the operator does: `tunebot budget set ...`); set it to the Slack user ids of "
                "the people who approve spending"
            )
        if not self.hub_namespaces:
            out.append(
                "TUNEBOT_HUB_NAMESPACES is not set: push_to_hub is refused; list the Hub users or "
                "organizations tunebot may create repos in"
            )
        if self.allowed_channels is None:
            out.append(
                "TUNEBOT_ALLOWED_CHANNELS is not set: members may launch jobs from any channel and from "
                "direct messages; list the channels (and `dm` to allow direct messages) to deny the rest"
            )
        return out

    def needs_approval(self, amount: float | None) -> bool:
        """Whether a job that may cost ``amount`` (the higher of its estimate and explicit max_cost, or a
        pricier fallback's projection; bot/engine/launching/approval.py) needs a person's approval."""
        return amount is not None and amount > self.approval_above

    def can_approve(
        self, user: str, owner: str, *, amount: float | None = None, public_push: bool = False
    ) -> Decision:
        """Approve (or reject) a job waiting for approval: a second person. The operator (CLI, console) may
        approve anything; a member never their own job (``amount``, ``public_push``: kept for the callers'
        reasons, they change nothing for a member); with admins configured only admins, with none nobody in
        Slack: the operator does, on the bot's machine."""
        del amount  # whatever it may cost: approval is always someone else's
        if user == OPERATOR:
            return Decision(True)
        if user == owner:
            return Decision(False, "you cannot approve your own job; " + self.approver_hint())
        if not self.admins:
            return Decision(False, self.approver_hint(capitalized=True))
        if public_push and not self.is_admin(user):
            return Decision(False, "only an admin approves a public Hub push")
        if not self.is_admin(user):
            return Decision(False, "only admins approve jobs")
        return Decision(True)

    def may_approve(self, user: str) -> Decision:
        """Whether ``user`` approves anything at all: asked before a job or sweep is looked up, so the refusal
        is the same whatever the id (``can_approve`` then decides for the one named)."""
        if user == OPERATOR or (self.admins and self.is_admin(user)):
            return Decision(True)
        if not self.admins:
            return Decision(False, self.approver_hint(capitalized=True))
        return Decision(False, "only admins approve jobs")

    def who_approves(self, owner: str, job_id: str) -> str:
        """Who approves a job of ``owner``, for the engine's messages."""
        if self.admins:
            return f"an admin other than {owner}" if owner in self.admins else "an admin"
        return f"the operator, on the bot's machine: `tunebot approve {job_id}`"

    def approver_hint(self, *, capitalized: bool = False) -> str:
        """Who approves here, for refusals and approval requests."""
        if self.admins:
            text = "another admin has to"
        else:
            text = (
                "no admin is configured (TUNEBOT_ADMINS), so the operator approves it on the bot's machine: "
                "`tunebot approve JOB`"
            )
        return text[0].upper() + text[1:] if capitalized else text

    def can_push_to_hub(self, user: str, repo: str, *, public: bool) -> Decision:
        """Push a job's result to this Hub repo: only into TUNEBOT_HUB_NAMESPACES; public only where an
        admin can approve it (``public_push_needs_approval``)."""
        namespace = repo.split("/", 1)[0]
        if not self.hub_namespaces:
            return Decision(
                False,
                "pushing to the Hub is off: the operator lists the Hub users or organizations tunebot may "
                "create repos in with TUNEBOT_HUB_NAMESPACES",
            )
        if namespace.lower() not in {n.lower() for n in self.hub_namespaces}:
            allowed = ", ".join(sorted(self.hub_namespaces))
            return Decision(
                False, f"tunebot pushes only to {allowed} (TUNEBOT_HUB_NAMESPACES), not to {namespace}"
            )
        if public and not self.admins and user != OPERATOR:
            return Decision(
                False, "a public Hub repo needs an admin's approval, and no admin is set (TUNEBOT_ADMINS)"
            )
        return Decision(True)

    def public_push_needs_approval(self, owner: str) -> bool:
        """A public Hub repo is an admin's decision: another admin approves a member's job."""
        return not self.is_admin(owner)

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
        """Who can raise a spent budget, for the refusal that names it (with ``budget_command``)."""
        if self.admins:
            return f"an admin ({', '.join(sorted(self.admins))})"
        return "the operator, on the bot's machine,"

    def budget_command(self) -> str:
        """The verb that raises a budget for ``who_raises_budgets``: `/tune budget` where admins set them, the
        CLI's `tunebot budget` where only the operator does."""
        return "budget" if self.admins else "tunebot budget"

    def budget_setter_hint(self) -> str:
        """Who sets budgets here, for the empty budget list."""
        if self.admins:
            return "An admin sets one with `budget set user|team NAME daily=X`."
        return (
            "No admin is configured (TUNEBOT_ADMINS): the operator sets one on the bot's machine with "
            f"`{BUDGET_SET}`."
        )

    def can_set_budget(self, user: str) -> Decision:
        """Set, raise or lower a budget (a user's or a team's): admins and the operator; with no admins
        configured, the operator alone (a member would raise their own spent budget, or lower another's)."""
        if self.is_admin(user):
            return Decision(True)
        if not self.admins:
            return Decision(
                False,
                "No admin is configured (TUNEBOT_ADMINS), so the operator sets budgets on the bot's machine: "
                f"`{BUDGET_SET}`",
            )
        return Decision(False, "only admins set budgets (TUNEBOT_ADMINS); ask one of them")


ENGINE = "engine"  # the engine's own actor name (idle stops, budget caps)
# The CLI's and the console's identity: the person who runs the bot on its machine (an admin of it). Not a
# Slack user id (those are U.../W... from Slack's signed payloads), so no member can be it.
OPERATOR = "operator"
BUDGET_SET = "tunebot budget set user|team NAME daily=X monthly=Y"  # the operator's verb (bot/commands)
