"""Command -> EngineAPI -> Reply: the chat layer's logic, shared by Slack and the terminal.

Synchronous (the engine is synchronous): Slack listeners run these in a worker thread after their
acknowledgement. No exception leaves this module: our errors (parse, planning, engine, permission)
become friendly replies with their message; anything else a generic reply plus ``logger.exception``.
"""

from __future__ import annotations

import inspect
import logging
import shlex
import threading
import time
import traceback
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.chat import cards
from bot.chat.blockkit import Names, no_names
from bot.chat.dashboard import home_reply
from bot.chat.escaping import esc, mention
from bot.chat.grammar import (
    ApproveCmd,
    BudgetSetCmd,
    BudgetShowCmd,
    CalibrateCmd,
    CloneCmd,
    Command,
    CompareCmd,
    EstimateCmd,
    GpusCmd,
    HelpCmd,
    JobsCmd,
    LaunchCmd,
    LaunchFormCmd,
    ParseError,
    ResumeCmd,
    SpendCmd,
    StatusCmd,
    StopCmd,
    SweepCmd,
    VolumesCmd,
    parse,
    usage_for,
)
from bot.chat.permissions import Permissions
from bot.chat.replies import Context, Reply, error_reply, text_reply
from bot.chat.slowwork import SlowWork
from bot.engine.api import EngineAPI, EngineError, JobView, PermissionDenied
from bot.engine.ids import check_job_id
from bot.engine.record.jobstate import OPEN, JobState
from bot.planner.errors import PlanningError
from bot.planner.request import EstimateRequest
from bot.planner.result import Estimate
from bot.planner.sources import SourcePolicy

log = logging.getLogger(__name__)

GENERIC_ERROR = "Something went wrong on our side; it has been logged. Please try again in a minute."
CHOICES = ("cheapest", "safest", "fastest")


@dataclass(frozen=True)
class Actor:
    """Who typed or clicked, and where."""

    user: str
    channel: str | None = None
    operator: bool = False  # the console's person runs the bot: may name local paths (sources.py)
    team: str | None = None  # the Slack workspace (team budgets); None: the engine's TUNEBOT_TEAM


def _where(actor: Actor, fallback: str | None = None) -> str | None:
    """The channel a launch comes from. A Slack request always names one; only the operator's console
    launches from nowhere (None), so a channel-less request from anyone else is "" (on no allow list)."""
    return actor.channel or fallback or (None if actor.operator else "")


def launch_part(estimate: Estimate) -> bytes:
    """What a launch button needs of an estimate, packed: the fitting offers (keys, prices, labels, the
    fallbacks a job may relaunch on) and the training plan; the rejected offers and notes stay behind.

    Compressed JSON: a full Estimate object is ~0.2 MB in memory and a bot keeps 2,000 of them; this is a
    few KB, and JSON gives back every price bit for bit (floats round-trip exactly)."""
    slim = estimate.model_copy(update={"offers": [o for o in estimate.offers if o.fits], "assumptions": []})
    return zlib.compress(slim.model_dump_json().encode(), 6)


@dataclass
class StoredEstimate:
    """An estimate a person saw, as its buttons need it (see ``launch_part``)."""

    request: EstimateRequest
    packed: bytes  # launch_part(estimate)
    user: str
    channel: str | None
    created: float = field(default_factory=time.time)
    job_id: str | None = None
    cancelled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(
        cls, request: EstimateRequest, estimate: Estimate, user: str, channel: str | None
    ) -> StoredEstimate:
        return cls(request, launch_part(estimate), user, channel)

    @property
    def estimate(self) -> Estimate:
        """The estimate to launch from: the offers and prices shown, without the rejected ones."""
        return Estimate.model_validate_json(zlib.decompress(self.packed))


@dataclass
class StoredSweep:
    """A sweep a person saw priced, as its Launch button needs it (the engine's SweepEstimate, whose runs'
    estimates ride along in private attributes)."""

    estimate: Any  # bot.engine.api.SweepEstimate
    user: str
    channel: str | None
    created: float = field(default_factory=time.time)
    job_id: str | None = None  # the sweep's id once launched
    cancelled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def request(self) -> EstimateRequest:
        return self.estimate.request  # type: ignore[no-any-return]


def is_sweep(ref: str) -> bool:
    return ref.startswith("sw-")


class EstimateStore:
    """Recent estimates by a short id, so buttons carry an id instead of the whole request."""

    def __init__(self, *, max_items: int = 2000, ttl_s: float = 86400.0) -> None:
        self._items: OrderedDict[str, StoredEstimate | StoredSweep] = OrderedDict()
        self._lock = threading.Lock()
        self.max_items = max_items
        self.ttl_s = ttl_s

    def put(self, stored: StoredEstimate | StoredSweep) -> str:
        key = "e" + uuid.uuid4().hex[:12]
        with self._lock:
            self._items[key] = stored
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return key

    def get(self, key: str) -> StoredEstimate | StoredSweep | None:
        with self._lock:
            item = self._items.get(key)
        if item is None or time.time() - item.created > self.ttl_s:
            return None
        return item


def _default_sources() -> SourcePolicy:
    from bot.settings import get_settings

    return SourcePolicy.from_settings(get_settings())


def _default_slow() -> SlowWork:
    from bot.settings import get_settings

    return SlowWork.from_settings(get_settings())


def _friendly_errors() -> tuple[type[BaseException], ...]:
    return (ParseError, PlanningError, EngineError)


class ChatHandlers:
    def __init__(
        self,
        engine: EngineAPI,
        permissions: Permissions | None = None,
        *,
        store: EstimateStore | None = None,
        secrets: list[str] | None = None,
        job_options: dict[str, Any] | None = None,
        sources: SourcePolicy | None = None,
        files: Any = None,
        names: Names | None = None,
        slow: SlowWork | None = None,
        chart_dir: Path | None = None,
    ) -> None:
        self.engine = engine
        self._charts = chart_dir  # where `compare` draws its charts (None: <data dir>/charts)
        # Display names for where a mention does not render (bot/chat/people.py in Slack; ids elsewhere).
        self.names: Names = names or no_names
        # Where chat users may point the bot (default: the settings'); ``files`` fetches Slack uploads.
        self.sources = sources if sources is not None else _default_sources()
        self.files = files
        # The pool slow commands run on in Slack (bot/chat/slowwork.py): one person never blocks another.
        self.slow = slow if slow is not None else _default_slow()
        # Extra keyword arguments for Engine.create_job beyond EngineAPI (the demo's spec_overrides).
        self.job_options = dict(job_options or {})
        # The engine's own policy unless one is given (the chat asks it first for a friendlier answer).
        self.permissions = permissions or getattr(engine, "permissions", None) or Permissions()
        self.store = store or EstimateStore()
        self.secrets = [s for s in (secrets or []) if s and len(s) >= 4]
        # Where a launched or resumed job's progress shows: its Slack thread, or the console's own lines.
        self.progress_note = cards.PROGRESS_IN_THREAD

    # ---- entry points (never raise) -------------------------------------------------------------

    def handle_text(self, text: str, actor: Actor) -> Reply:
        return self._safely(lambda: self.handle(parse(text), actor))

    def handle(self, command: Command, actor: Actor) -> Reply:
        return self._safely(lambda: self._dispatch(command, actor))

    def launch(self, estimate_id: str, choice: str, actor: Actor) -> Reply:
        return self._safely(lambda: self._launch(estimate_id, choice, actor))

    def cancel_estimate(self, estimate_id: str, actor: Actor) -> Reply:
        return self._safely(lambda: self._cancel(estimate_id, actor))

    def approve(self, job_id: str, actor: Actor) -> Reply:  # a button's value: checked before any lookup
        return self._safely(lambda: self._approve(check_job_id(job_id), actor))

    def reject(self, job_id: str, actor: Actor) -> Reply:
        return self._safely(lambda: self._reject(check_job_id(job_id), actor))

    def stop(self, job_id: str, actor: Actor) -> Reply:
        return self._safely(lambda: self._stop(check_job_id(job_id), actor))

    def resume(self, job_id: str, actor: Actor) -> Reply:
        """The card's Resume button: `resume JOB` with the job's cap."""
        return self._safely(lambda: self._resume(job_id, None, actor))

    def volume_action(self, ref: str, action: str, actor: Actor) -> Reply:
        return self._safely(lambda: self._volume(ref, action, actor))

    def home(self, user: str) -> Reply:
        return self._safely(lambda: self._home(user))

    def check_budget_setter(self, actor: Actor) -> None:
        """Raise PermissionDenied (with who sets budgets here) unless ``actor`` may set budgets."""
        decision = self.permissions.can_set_budget(actor.user)
        if not decision:
            raise PermissionDenied(decision.reason)

    def budget_modal_refusal(self, actor: Actor) -> Reply | None:
        """The "Set a budget" button: None when ``actor`` may set budgets (open the modal), else the refusal
        (App Home offers the button only to them; a forged click gets this instead of the modal)."""
        try:
            self.check_budget_setter(actor)
        except PermissionDenied as exc:
            return error_reply(f"Not allowed: {self.scrub(str(exc))}")
        return None

    def set_budget(self, scope: str, target: str, daily: str, monthly: str, actor: Actor) -> Reply:
        """The budget modal's values, through the same grammar as `budget set ...`."""
        words = ["budget", "set", scope, target]
        words += [f"daily={daily}"] if daily.strip() else []
        words += [f"monthly={monthly}"] if monthly.strip() else []
        return self._safely(lambda: self._dispatch(parse(" ".join(shlex.quote(w) for w in words)), actor))

    @staticmethod
    def is_slow(command: Command) -> bool:
        """Commands that read datasets, the Hub or every cloud: they run on ``self.slow`` (a clone estimates
        its job's dataset again)."""
        return isinstance(command, EstimateCmd | LaunchCmd | GpusCmd | CloneCmd | SweepCmd | CompareCmd)

    @staticmethod
    def quick_ack(command: Command) -> str | None:
        """The immediate acknowledgement for slow commands (None: the command is fast)."""
        if isinstance(command, EstimateCmd | LaunchCmd):
            r = command.request
            return f":hourglass: Estimating {esc(r.model[:200])} {r.method}…"
        if isinstance(command, CloneCmd):
            return f":hourglass: Estimating a clone of job {esc(command.job_id)}…"
        if isinstance(command, SweepCmd):
            runs = 1
            for values in command.grid.values():
                runs *= len(values)
            model = esc(command.request.model[:200])
            return f":hourglass: Estimating a sweep of {runs} configurations of {model}…"
        if isinstance(command, HelpCmd):
            return None
        return ":hourglass: Working on it…"

    # ---- plumbing -------------------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def _safely(self, fn: Callable[[], Reply]) -> Reply:
        try:
            return fn()
        except ParseError as exc:
            return error_reply(self.scrub(exc.message), exc.usage)
        except PermissionDenied as exc:
            return error_reply(f"Not allowed: {self.scrub(str(exc))}")
        except (PlanningError, EngineError) as exc:
            return error_reply(self.scrub(str(exc)) or "the request was refused")
        except KeyError as exc:  # engines raise KeyError for unknown ids
            return error_reply(f"not found: {self.scrub(str(exc).strip(chr(39)))[:200]}")
        except OSError as exc:  # e.g. [Errno 36] File name too long: the input, not our side
            log.warning("chat command refused: %s", self.scrub(repr(exc))[:500])
            return error_reply(f"that input cannot be used: {exc.strerror or type(exc).__name__}")
        except UnicodeError:
            return error_reply("the command has text that is not valid UTF-8")
        except ValueError as exc:
            if type(exc).__module__.startswith("pydantic"):  # our own data failed validation: a bug
                log.error("chat command failed\n%s", self.scrub(traceback.format_exc()))
                return error_reply(GENERIC_ERROR)
            log.warning("chat command refused: %s", self.scrub(repr(exc))[:500])
            return error_reply(f"invalid value: {self.scrub(str(exc))[:300]}")
        except Exception:  # noqa: BLE001 - a person never sees a traceback
            # The traceback goes to the log, scrubbed: exception texts may quote keys or tokens.
            log.error("chat command failed\n%s", self.scrub(traceback.format_exc()))
            return error_reply(GENERIC_ERROR)

    def _dispatch(self, command: Command, actor: Actor) -> Reply:
        """The reply to a parsed command: the answer its type is given in ``_ANSWERS``."""
        for kind, answer in _ANSWERS:
            if isinstance(command, kind):
                return answer(self, command, actor)
        raise ParseError(f"unsupported command {command.name}")

    def _check_can_launch(self, actor: Actor) -> None:
        """Raise PermissionDenied unless ``actor`` may launch from where they are."""
        decision = self.permissions.can_launch(actor.user, _where(actor))
        if not decision:
            raise PermissionDenied(decision.reason)

    def _answer_estimate(self, command: EstimateCmd, actor: Actor) -> Reply:
        return self._estimate(self._checked_sources(command.request, actor), actor, launching=False)

    def _answer_launch_form(self, command: LaunchFormCmd, actor: Actor) -> Reply:
        """Slack opens a form instead; here a MODEL is needed."""
        raise ParseError("`launch` needs a MODEL first (e.g. Llama-3.1-8B)", usage_for("launch"))

    def _answer_launch(self, command: LaunchCmd, actor: Actor) -> Reply:
        self._check_can_launch(actor)
        return self._estimate(self._checked_sources(command.request, actor), actor, launching=True)

    def _answer_status(self, command: StatusCmd, actor: Actor) -> Reply:
        """A sweep's card, a job's card, or the person's active jobs."""
        if command.job_id and is_sweep(command.job_id):
            return cards.sweep_card(self._seen_sweep(command.job_id, actor))
        if command.job_id:  # another member's job is answered as one that does not exist
            return cards.job_card(self._seen_job(command.job_id, actor), with_samples=True)
        jobs = self.engine.list_jobs(user=actor.user, active_only=True, viewer=actor.user)
        return cards.jobs_reply(jobs, title="Your active jobs")

    def _answer_jobs(self, command: JobsCmd, actor: Actor) -> Reply:
        return self._jobs(command.scope, actor)

    def _answer_stop(self, command: StopCmd, actor: Actor) -> Reply:
        """A job, or a whole sweep (its runs stop after a checkpoint)."""
        if not is_sweep(command.job_id):
            return self._stop(command.job_id, actor)
        self._seen_sweep(command.job_id, actor)  # the viewer first: another member's is "no sweep"
        view = self.engine.stop_sweep(command.job_id, user=actor.user)
        return text_reply(
            f":octagonal_sign: Sweep *{esc(view.sweep_id)}* is {esc(view.state)}: its runs stop after a "
            f"checkpoint; spent {cards.money(view.spend)} of {cards.money(view.max_cost)}."
        )

    def _answer_compare(self, command: CompareCmd, actor: Actor) -> Reply:
        return self._compare(list(command.job_ids), actor)

    def _answer_sweep(self, command: SweepCmd, actor: Actor) -> Reply:
        """The sweep priced and stored: its Launch button carries the stored id."""
        self._check_can_launch(actor)
        request = self._checked_sources(command.request, actor)
        estimate = self.engine.estimate_sweep(request, command.grid)
        estimate_id = self.store.put(StoredSweep(estimate, actor.user, actor.channel))
        return cards.sweep_estimate_reply(estimate, estimate_id=estimate_id)

    def _answer_resume(self, command: ResumeCmd, actor: Actor) -> Reply:
        return self._resume(command.job_id, command.max_cost, actor)

    def _answer_clone(self, command: CloneCmd, actor: Actor) -> Reply:
        self._check_can_launch(actor)
        self._seen_job(command.job_id, actor)
        # The engine refuses another member's job; the data is checked for the cloner, as a launch's is.
        request = self.engine.clone_request(command.job_id, command.changes, user=actor.user)
        return self._estimate(self._checked_sources(request, actor), actor, launching=True)

    def _answer_approve(self, command: ApproveCmd, actor: Actor) -> Reply:
        return self._approve(command.job_id, actor)

    def _answer_spend(self, command: SpendCmd, actor: Actor) -> Reply:
        return self._spend(command.period, command.user, actor)

    def _answer_volumes(self, command: VolumesCmd, actor: Actor) -> Reply:
        return cards.volumes_reply(self.engine.volumes(viewer=actor.user))

    def _answer_gpus(self, command: GpusCmd, actor: Actor) -> Reply:
        return self._gpus(command.gpu)

    def _answer_budget_show(self, command: BudgetShowCmd, actor: Actor) -> Reply:
        return cards.budgets_reply(
            self.engine.budgets(viewer=actor.user),  # a member: their own (the engine filters)
            who_sets=self.permissions.budget_setter_hint(),
            only_yours=not self.permissions.sees_everyone(actor.user),
        )

    def _answer_budget_set(self, command: BudgetSetCmd, actor: Actor) -> Reply:
        self.check_budget_setter(actor)  # the engine decides again, whatever the door
        view = self.engine.set_budget(
            command.scope, command.target, daily=command.daily, monthly=command.monthly, user=actor.user
        )
        return cards.budget_saved_reply(view)

    def _answer_help(self, command: HelpCmd, actor: Actor) -> Reply:
        return cards.help_reply(command.topic)

    def _calibrate(self, command: CalibrateCmd, actor: Actor) -> Reply:
        """`calibrate [show | exclude RUN | include RUN]`: admins only (the engine decides again)."""
        if not self.permissions.is_admin(actor.user):
            raise PermissionDenied(
                "only admins see or change what moved the estimates (TUNEBOT_ADMINS; the operator on the "
                "bot's machine: `tunebot calibrate show`)"
            )
        if command.action == "show":
            return cards.calibration_reply(self.engine.calibration(user=actor.user))
        done = self.engine.exclude_calibration_run(
            command.run or "", user=actor.user, undo=command.action == "include"
        )
        return text_reply(f"{mention(actor.user)}: {esc(done)}.", public=True, kind="success")

    def _jobs(self, scope: str, actor: Actor) -> Reply:
        """`jobs` (mine) or `jobs all`: everyone's only for those the policy lets read them; a member asking
        for all gets their own, told why."""
        if scope != "all":
            return cards.jobs_reply(
                self.engine.list_jobs(user=actor.user, viewer=actor.user), title="Your jobs"
            )
        decision = self.permissions.can_read_user(actor.user, None)
        if decision:
            return cards.jobs_reply(self.engine.list_jobs(viewer=actor.user), title="All jobs")
        reply = cards.jobs_reply(self.engine.list_jobs(user=actor.user, viewer=actor.user), title="Your jobs")
        reply.add(Context([esc(decision.reason[0].upper() + decision.reason[1:]) + "."]))
        return reply

    def _spend(self, period: str, whose: str | None, actor: Actor) -> Reply:
        """`spend [period] [@user]`: a member's own unless the policy lets them read everyone's."""
        if whose is None and not self.permissions.sees_everyone(actor.user):
            whose = actor.user
        decision = self.permissions.can_read_user(actor.user, whose)
        if not decision:
            raise PermissionDenied(decision.reason)
        report = self.engine.spend(period, user=whose, viewer=actor.user)  # type: ignore[arg-type]
        return cards.spend_reply(report, user=whose)

    def _checked_sources(self, request: EstimateRequest, actor: Actor) -> EstimateRequest:
        """The request with its model and dataset checked against the source policy (the operator may
        name any local path) and Slack uploads fetched; what is estimated and launched is what was checked."""
        from bot.planner.models import table_lookup
        from bot.planner.sources import SourceError, check_source, slack_file_id

        policy = None if actor.operator else self.sources
        updates: dict[str, str] = {}
        for role in ("model", "dataset", "prompts"):
            value = getattr(request, role)
            if value is None:
                continue
            kind, use = check_source(value, role, policy, is_name=lambda v: table_lookup(v) is not None)
            if kind == "slack_file":
                file_id = slack_file_id(value) or ""
                if self.files is None:
                    raise SourceError(f"{role}: Slack files can only be used from Slack")
                use = str(self.files.fetch(file_id, actor.user, actor.channel))
            if use != value:
                updates[role] = use
        return request.model_copy(update=updates) if updates else request

    def form_estimate(
        self, request: EstimateRequest, actor: Actor
    ) -> tuple[str | None, Estimate | None, Reply]:
        """The launch form's estimate, checked and stored as a typed one is (its id launches it):
        (estimate id, estimate, reply), or (None, None, the friendly refusal)."""
        found: list[tuple[str, Estimate]] = []

        def run() -> Reply:
            decision = self.permissions.can_launch(actor.user, actor.channel)
            if not decision:
                raise PermissionDenied(decision.reason)
            checked = self._checked_sources(request, actor)
            estimate = self.engine.estimate(checked)
            stored = StoredEstimate.of(checked, estimate, actor.user, actor.channel)
            found.append((self.store.put(stored), estimate))
            return text_reply("estimated")

        reply = self._safely(run)
        return (*found[0], reply) if found else (None, None, reply)

    def _estimate(self, request: EstimateRequest, actor: Actor, *, launching: bool) -> Reply:
        estimate = self.engine.estimate(request)
        estimate_id = self.store.put(StoredEstimate.of(request, estimate, actor.user, actor.channel))
        return cards.estimate_reply(estimate, estimate_id=estimate_id, launching=launching)

    def _launch(self, estimate_id: str, choice: str, actor: Actor) -> Reply:
        if choice == "sweep":
            return self._launch_sweep(estimate_id, actor)
        if choice not in CHOICES:
            raise EngineError(f"unknown launch choice {choice[:40]!r}")
        stored = self.store.get(estimate_id)
        if stored is None:
            return error_reply("This estimate has expired; run the estimate again.")
        if not isinstance(stored, StoredEstimate):
            return error_reply("This is a sweep's estimate: its button launches it.")
        channel = _where(actor, stored.channel)
        decision = self.permissions.can_launch(actor.user, channel)
        if not decision:
            raise PermissionDenied(decision.reason)
        with stored.lock:  # a double click waits here, then sees the job of the first click
            if stored.cancelled:
                return text_reply("This estimate was cancelled; run it again to launch.")
            if stored.job_id:
                job = self.engine.get_job(stored.job_id)
                return text_reply(
                    f"Already launched as job *{esc(job.job_id)}* ({esc(job.state)}); "
                    "nothing new was started."
                )
            job = self.engine.create_job(
                stored.request,
                user=actor.user,
                choice=choice,
                max_cost=stored.request.max_cost,
                channel=channel,
                idempotency_key=f"estimate:{estimate_id}",
                team=actor.team,
                **self.job_options,
                **self._estimate_kwarg(stored),
            )
            stored.job_id = job.job_id
        return self._launched(job, choice)

    def _launch_sweep(self, estimate_id: str, actor: Actor) -> Reply:
        stored = self.store.get(estimate_id)
        if not isinstance(stored, StoredSweep):
            return error_reply("This sweep estimate has expired; run the sweep command again.")
        channel = _where(actor, stored.channel)
        decision = self.permissions.can_launch(actor.user, channel)
        if not decision:
            raise PermissionDenied(decision.reason)
        with stored.lock:  # a double click waits here, then sees the sweep of the first click
            if stored.cancelled:
                return text_reply("This sweep was cancelled; run it again to launch.")
            if stored.job_id:
                view = self.engine.get_sweep(stored.job_id)
                return text_reply(f"Already launched as sweep *{esc(view.sweep_id)}* ({esc(view.state)}).")
            view = self.engine.create_sweep(
                stored.estimate,
                user=actor.user,
                channel=channel,
                team=actor.team,
                idempotency_key=f"sweep:{estimate_id}",
                **{k: v for k, v in self.job_options.items() if k == "spec_overrides"},
            )
            stored.job_id = view.sweep_id
        if view.state == "pending_approval":
            return text_reply(
                f":hourglass: Sweep *{esc(view.sweep_id)}* may spend up to {cards.money(view.max_cost)}, "
                f"above the {cards.money(self.permissions.approval_above)} approval amount: an admin has "
                f"been asked to approve it (`approve {esc(view.sweep_id)}`).",
                kind="warning",
            )
        runs = len(view.runs)
        return text_reply(
            f":rocket: Sweep *{esc(view.sweep_id)}* launched: {runs} runs, at most "
            f"{cards.money(view.max_cost)} in total. Each run is a line in its thread; `status "
            f"{esc(view.sweep_id)}` shows them.",
            kind="success",
        )

    def _compare(self, ids: list[str], actor: Actor) -> Reply:
        """Runs side by side with their eval curves on one chart (a sweep's runs for a sweep id)."""
        from bot.chat.charts import compare_chart

        if len(ids) == 1 and is_sweep(ids[0]):
            sweep = self._seen_sweep(ids[0], actor)
            ids = [r.job.job_id for r in sweep.runs if r.job is not None]
        view = self.engine.compare(ids, user=actor.user)
        chart = compare_chart(view, self._chart_dir() / f"compare-{'-'.join(ids)[:100]}.png")
        return cards.compare_reply(view, chart=chart)

    def _seen_job(self, job_id: str, actor: Actor) -> JobView:
        """The job as ``actor`` may know of it. Every door that names a job asks this before anything else:
        one another member may not read is answered as one that does not exist (the engine's own words for
        that), so no answer tells whether it exists, whose it is or what it ran."""
        try:
            return self.engine.get_job(job_id, viewer=actor.user)
        except PermissionDenied:
            raise EngineError(f"no job {job_id}") from None

    def _seen_sweep(self, sweep_id: str, actor: Actor) -> Any:
        """``_seen_job`` for a sweep: another member's is "no sweep", like one that does not exist."""
        try:
            return self.engine.get_sweep(sweep_id, viewer=actor.user)
        except PermissionDenied:
            raise EngineError(f"no sweep {sweep_id}") from None

    def _chart_dir(self) -> Path:
        """Where `compare` draws: the folder given, else <data dir>/charts (the engine's data dir where it
        has one), with the rest of tunebot's files, never /tmp."""
        from bot.chat.charts import charts_folder

        if self._charts is None:
            settings = getattr(self.engine, "settings", None)
            if settings is None:
                from bot.settings import get_settings

                settings = get_settings()
            self._charts = charts_folder(settings.data_dir)
        return self._charts

    def _estimate_kwarg(self, stored: StoredEstimate) -> dict[str, Any]:
        """Launch from the estimate the person saw, where the engine accepts it (EngineAPI does not say)."""
        try:
            params = inspect.signature(self.engine.create_job).parameters
        except (TypeError, ValueError):
            return {}
        return {"estimate": stored.estimate} if "estimate" in params else {}

    def _launched(self, job: JobView, choice: str) -> Reply:
        if job.state == JobState.PENDING_APPROVAL:
            above = cards.money(self.permissions.approval_above)
            who = (
                "an admin has been asked to approve it."
                if self.permissions.admins
                else cards.operator_approves(job.job_id)
            )
            return text_reply(
                f":hourglass: Job *{esc(job.job_id)}* may spend up to {cards.money(job.max_cost)} (estimated "
                f"{cards.money(job.estimated_cost)}), above the {above} approval amount: {who}",
                kind="warning",
            )
        where = esc(f" on {job.provider} {job.gpu or ''} x{job.gpu_count or 1}") if job.provider else ""
        price = f" at {cards.money(job.price_per_hour)}/h" if job.price_per_hour is not None else ""
        return text_reply(
            f":rocket: Launching job *{esc(job.job_id)}* ({esc(choice)}){where}{price}. "
            + self.progress_note.format(job_id=esc(job.job_id)),
            kind="success",
        )

    def _cancel(self, estimate_id: str, actor: Actor) -> Reply:
        stored = self.store.get(estimate_id)
        if stored is not None:
            with stored.lock:
                if stored.job_id:
                    return text_reply(
                        f"Already launched as job *{esc(stored.job_id)}*; use `stop {esc(stored.job_id)}`."
                    )
                stored.cancelled = True
        return text_reply("Cancelled; nothing was launched.")

    def _check_may_approve(self, ref: str, actor: Actor) -> None:
        """Who may approve at all. Someone who may not is told why in words that are the same for every id
        they cannot read (one that does not exist included); the owner of the job or sweep is told it is
        theirs to have approved by someone else."""
        decision = self.permissions.may_approve(actor.user)
        if decision:
            return
        try:
            owner = (self._seen_sweep(ref, actor) if is_sweep(ref) else self._seen_job(ref, actor)).owner
        except EngineError:
            raise PermissionDenied(decision.reason) from None
        specific = self.permissions.can_approve(actor.user, owner)  # e.g. "you cannot approve your own job"
        raise PermissionDenied(decision.reason if specific else specific.reason)

    def _approve(self, job_id: str, actor: Actor) -> Reply:
        self._check_may_approve(job_id, actor)
        if is_sweep(job_id):
            self._seen_sweep(job_id, actor)
            view = self.engine.approve_sweep(job_id, approver=actor.user)
            return text_reply(
                f":white_check_mark: {mention(actor.user)} approved sweep *{esc(view.sweep_id)}*; it is "
                f"{esc(view.state)}." + (f" {esc(view.message)}" if view.message else ""),
                public=True,
                kind="success",
            )
        job = self._seen_job(job_id, actor)
        at_stake = max(job.estimated_cost or 0.0, job.max_cost or 0.0)
        decision = self.permissions.can_approve(actor.user, job.owner, amount=at_stake)
        if not decision:
            raise PermissionDenied(decision.reason)
        if job.state != JobState.PENDING_APPROVAL:
            return text_reply(f"Job *{esc(job.job_id)}* is {esc(job.state)}; there is nothing to approve.")
        job = self.engine.approve(job_id, approver=actor.user)
        return text_reply(
            f":white_check_mark: {mention(actor.user)} approved job *{esc(job.job_id)}*; "
            f"it is {esc(job.state)}.",
            public=True,
            kind="success",
        )

    def _reject(self, job_id: str, actor: Actor) -> Reply:
        self._check_may_approve(job_id, actor)
        if is_sweep(job_id):
            sweep = self._seen_sweep(job_id, actor)
            decision = self.permissions.can_approve(actor.user, sweep.owner, amount=sweep.max_cost)
            if not decision:
                raise PermissionDenied(decision.reason)
            if sweep.state != "pending_approval":
                return text_reply(f"Sweep *{esc(sweep.sweep_id)}* is {esc(sweep.state)}; nothing to reject.")
            sweep = self.engine.stop_sweep(job_id, user=actor.user)
            return text_reply(
                f"{mention(actor.user)} rejected sweep *{esc(sweep.sweep_id)}*; it is {esc(sweep.state)}.",
                public=True,
            )
        job = self._seen_job(job_id, actor)
        at_stake = max(job.estimated_cost or 0.0, job.max_cost or 0.0)
        decision = self.permissions.can_approve(actor.user, job.owner, amount=at_stake)
        if not decision:
            raise PermissionDenied(decision.reason)
        if job.state != JobState.PENDING_APPROVAL:
            return text_reply(f"Job *{esc(job.job_id)}* is {esc(job.state)}; there is nothing to reject.")
        job = self.engine.stop(job_id, user=actor.user, reason="rejected")
        return text_reply(
            f"{mention(actor.user)} rejected job *{esc(job.job_id)}*; it is {esc(job.state)}.", public=True
        )

    def _stop(self, job_id: str, actor: Actor) -> Reply:
        job = self._seen_job(job_id, actor)
        decision = self.permissions.can_stop(actor.user, job.owner)
        if not decision:
            raise PermissionDenied(decision.reason)
        if job.state not in OPEN:
            return text_reply(f"Job *{esc(job.job_id)}* is already {esc(job.state)}.")
        job = self.engine.stop(job_id, user=actor.user, reason="user")
        return text_reply(
            f":octagonal_sign: Stopping job *{esc(job.job_id)}* ({esc(job.state)}); spend so far "
            f"{cards.money(job.spend)}."
        )

    def _resume(self, job_id: str, max_cost: float | None, actor: Actor) -> Reply:
        """Ask the engine to continue the job (it checks the owner, the cap and approval)."""
        self._seen_job(job_id, actor)
        job = self.engine.resume(job_id, user=actor.user, max_cost=max_cost, channel=actor.channel)
        return cards.resumed_reply(
            job,
            approval_above=self.permissions.approval_above,
            admins=bool(self.permissions.admins),
            progress=self.progress_note,
        )

    def _volume(self, ref: str, action: str, actor: Actor) -> Reply:
        provider, sep, volume_id = ref.partition(":")
        if not sep or not volume_id:
            raise EngineError("that volume reference is not valid")
        # Only the volumes ``actor`` may see (a member: their own jobs'): another's is "no volume", as a
        # volume that does not exist is.
        seen = self.engine.volumes(viewer=actor.user)
        volume = next((v for v in seen if v.provider == provider and v.volume_id == volume_id), None)
        if volume is None:
            raise EngineError(f"no volume {volume_id[:80]} on {provider[:40]} (`volumes` lists them)")
        # Asked first for the reason; the engine decides again on its own (the same policy).
        decision = self.permissions.can_manage_volume(actor.user, owner=volume.owner, tracked=volume.tracked)
        if not decision:
            raise PermissionDenied(decision.reason)
        name = esc(volume.name or volume_id)
        if action == "delete":
            self.engine.delete_volume(provider, volume_id, user=actor.user)
            return text_reply(
                f":wastebasket: {mention(actor.user)} deleted volume *{name}* on {esc(provider)}.",
                public=True,
            )
        if action == "keep":
            self.engine.keep_volume(provider, volume_id, user=actor.user)
            return text_reply(
                f"{mention(actor.user)} keeps volume *{name}*; no more reminders for it this week.",
                public=True,
            )
        raise EngineError(f"unknown volume action {action[:40]!r}")

    def _gpus(self, gpu: str | None) -> Reply:
        """Cheapest offers per GPU from the engine's price list: live where a cloud's key is set, else the
        dated snapshot, with each cloud's price source under the table (cards.gpus_reply)."""
        from bot.planner.gpus import gpu as lookup_gpu

        name = lookup_gpu(gpu).name if gpu else None  # PlanningError for unknown names: a friendly reply
        return cards.gpus_reply(self.engine.price_list(name), name)

    def _home(self, user: str) -> Reply:
        return home_reply(self.engine.dashboard(user))


# Each command's answer, by its type (``ChatHandlers._dispatch``).
_ANSWERS: tuple[tuple[type[Command], Callable[[ChatHandlers, Any, Actor], Reply]], ...] = (
    (EstimateCmd, ChatHandlers._answer_estimate),
    (LaunchFormCmd, ChatHandlers._answer_launch_form),
    (LaunchCmd, ChatHandlers._answer_launch),
    (StatusCmd, ChatHandlers._answer_status),
    (JobsCmd, ChatHandlers._answer_jobs),
    (StopCmd, ChatHandlers._answer_stop),
    (CompareCmd, ChatHandlers._answer_compare),
    (SweepCmd, ChatHandlers._answer_sweep),
    (ResumeCmd, ChatHandlers._answer_resume),
    (CloneCmd, ChatHandlers._answer_clone),
    (ApproveCmd, ChatHandlers._answer_approve),
    (SpendCmd, ChatHandlers._answer_spend),
    (VolumesCmd, ChatHandlers._answer_volumes),
    (GpusCmd, ChatHandlers._answer_gpus),
    (BudgetShowCmd, ChatHandlers._answer_budget_show),
    (BudgetSetCmd, ChatHandlers._answer_budget_set),
    (CalibrateCmd, ChatHandlers._calibrate),
    (HelpCmd, ChatHandlers._answer_help),
)
