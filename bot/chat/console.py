"""The terminal chat: the same commands against the same engine, replies and engine events via rich.

Reads commands line by line from any iterable (stdin), so it is scriptable: after `launch ...` the
next line answers the confirmation (`cheapest`, `safest`, `yes` = cheapest, anything else = no).
`exit`, `quit` or end of input ends the session.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape

from bot.chat import cards
from bot.chat.grammar import ApproveCmd, CloneCmd, LaunchCmd, ParseError, SweepCmd, parse
from bot.chat.handlers import Actor, ChatHandlers
from bot.chat.notifier import MILESTONES, K, milestone_text, summary_reply, volume_from_event
from bot.chat.replies import Buttons, Reply, error_reply
from bot.chat.terminal import markup, render
from bot.chat.weekly import weekly_reply
from bot.engine.api import EngineAPI, WeeklyReport
from bot.engine.events import EngineEvent
from bot.engine.permissions import OPERATOR
from bot.engine.record.jobstate import FINAL

log = logging.getLogger(__name__)
CONSOLE_USER = OPERATOR  # the console's person runs the bot: the operator, an admin of this machine
PROMPT = "tunebot> "


class ConsoleNotifier:
    """Engine events printed as they happen: progress lines, milestones, alerts, summaries, reminders."""

    def __init__(
        self,
        engine: EngineAPI,
        console: Console,
        *,
        progress_every_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.console = console
        self.progress_every_s = progress_every_s
        self.clock = clock
        self._last_progress: dict[str, float] = {}
        self._lock = threading.Lock()
        self.seen: list[EngineEvent] = []
        self._sweep_of: dict[str, str | None] = {}  # job id -> its sweep (a sweep's runs print as its lines)
        self.chart_dir: Any = None  # where a finished sweep's comparison chart is drawn

    def attach(self, bus: Any) -> ConsoleNotifier:
        bus.subscribe(self.on_event)
        return self

    def on_event(self, event: EngineEvent) -> None:
        with self._lock:
            self.seen.append(event)
            self._print(event)

    def _job(self, event: EngineEvent) -> Any:
        if not event.job_id:
            return None
        try:
            return self.engine.get_job(event.job_id)
        except Exception:  # noqa: BLE001 - printing never fails the engine
            return None

    def _stale(self, event: EngineEvent, step: Any) -> bool:
        """Whether the job has already recorded a later step than this progress event's (the events of one
        read are announced after all of them are stored): "step 192/1200" right before "Finished at step
        1200" said nothing true. Read only for a line that would be printed (the throttle passed)."""
        job = self._job(event)  # the reported step: a heartbeat ahead of the reports is not a later report
        return isinstance(step, int) and job is not None and job.reported_step > step

    def _in_sweep(self, event: EngineEvent) -> str | None:
        """The sweep the event's job is a run of (looked up once per job)."""
        job_id = event.job_id
        if not job_id:
            return None
        if job_id not in self._sweep_of:
            job = self._job(event)
            self._sweep_of[job_id] = getattr(job, "sweep_id", None)
        return self._sweep_of[job_id]

    def _sweep_event(self, event: EngineEvent) -> None:
        """A sweep's own lines: created, each stage's decision, the end with its runs compared."""
        sweep_id = str(event.data.get("sweep_id") or "")
        tag = f"[dim]\\[{sweep_id}][/dim] "
        self.console.print(tag + markup(f":bar_chart: {event.message}"), highlight=False)
        if event.kind != K.sweep_done:
            return
        try:
            view = self.engine.get_sweep(sweep_id)
            ids = [r.job.job_id for r in view.runs if r.job is not None]
            compare = self.engine.compare(ids, user=view.owner) if len(ids) > 1 else None
            chart = None
            if compare is not None:
                from pathlib import Path

                from bot.chat.charts import charts_folder, compare_chart

                folder = Path(self.chart_dir or charts_folder(self._data_dir()))
                chart = compare_chart(compare, folder / f"{sweep_id}-compare.png")
            render(cards.sweep_done_reply(view, compare, chart=chart), self.console)
        except Exception:  # noqa: BLE001 - printing never fails the engine
            log.exception("could not print the end of sweep %s", sweep_id)

    def _data_dir(self) -> Any:
        """The engine's data folder (TUNEBOT_DATA_DIR), where a sweep's chart is kept."""
        settings = getattr(self.engine, "settings", None)
        if settings is None:
            from bot.settings import get_settings

            settings = get_settings()
        return settings.data_dir

    def _print(self, event: EngineEvent) -> None:
        kind = event.kind
        tag = f"[dim]\\[{event.job_id}][/dim] " if event.job_id else ""
        if kind in (K.sweep_created, K.sweep_stage, K.sweep_done):
            self._sweep_event(event)
            return
        if self._in_sweep(event) and kind not in (K.finished, K.failed, K.preempted, K.warning):
            return  # a sweep's run: its stage lines say what matters, not every step of every run
        if kind == K.progress:
            now = self.clock()
            if now - self._last_progress.get(event.job_id or "", -1e9) < self.progress_every_s:
                return
            d = event.data
            if self._stale(event, d.get("step")):
                return  # a burst (an hourly report, cut into bounded events): its newest step is the news
            self._last_progress[event.job_id or ""] = now
            total = f"/{d['max_steps']}" if d.get("max_steps") else ""
            loss = f"  loss [bold]{d['loss']:.4f}[/bold]" if isinstance(d.get("loss"), int | float) else ""
            eta = (
                f"  eta {cards.duration(d['eta_seconds'])}"
                if isinstance(d.get("eta_seconds"), int | float)
                else ""
            )
            self.console.print(f"{tag}step {d.get('step', '?')}{total}{loss}{eta}", highlight=False)
        elif kind in MILESTONES:
            job = self._job(event)
            self.console.print(tag + markup(milestone_text(event, job)), highlight=False)
            samples = (
                cards.samples_reply(job) if job is not None and kind in (K.finished, K.plateau) else None
            )
            if samples is not None:  # the side-by-side answers under the finish
                render(samples, self.console)
        elif kind == K.job_created:
            self.console.print(tag + markup(event.message or "job created"), style="dim", highlight=False)
        elif kind == K.approval_needed:
            self.console.print(
                tag + markup(f":bell: {event.message} (an admin answers `approve JOB`)"),
                style="yellow",
                highlight=False,
            )
        elif kind == K.budget_alert:
            self.console.print(markup(f":moneybag: {event.message}"), style="yellow", highlight=False)
        elif kind == K.idle_volume:
            volume = volume_from_event(event, self.engine)
            if volume is not None:
                render(cards.volume_reminder(volume), self.console)
            else:
                self.console.print(markup(f":floppy_disk: {event.message}"), highlight=False)
        elif kind == K.daily_summary:
            render(summary_reply(event, self.engine), self.console)
        elif kind == K.weekly_report:
            render(weekly_reply(WeeklyReport.model_validate(event.data.get("report") or {})), self.console)


# The events by which this process announces a change of a job's state (ElsewhereWatcher tells the others').
ANNOUNCED = MILESTONES | {K.job_created, K.approval_needed, K.resumed}
# Those that tell a job's creation: a job this process made (a sweep's verify run is announced by its start).
CREATION = {K.job_created, K.approval_needed, K.job_started}
MAX_ENDED = 10_000  # ended jobs remembered (a resume of one is told as a resume); jobs this process created


class ElsewhereWatcher:
    """What other processes did to the jobs (a CLI launch, its start, an approval, a stop, a resume; an end a
    `launch --wait` saw), told where this process tells its own (`tunebot serve`'s log): their events never
    reach this process's bus, their changes do reach the store. Every ``every_s`` the store's record of what
    happened to jobs (the audit log: creates, resumes, state changes) is read on from where the last read
    ended, by its primary key, and each job it names is read back: a change this process did not announce
    on its own bus within ``settle_s`` of being seen is told once, as "by another process", also when the
    job already ended by then (its launch and its end in one line) and when it came back to the state it
    had (a resume that ended)."""

    def __init__(
        self,
        engine: EngineAPI,
        console: Console,
        *,
        every_s: float = 5.0,
        settle_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.console = console
        self.every_s = every_s
        self.settle_s = settle_s
        self.clock = clock
        self._known: dict[str, str] | None = None  # active job id -> the state last told (None: not read yet)
        self._ended: dict[str, str] = {}  # job id -> the final state told (a resume makes it active again)
        self._seen: dict[str, tuple[str, float]] = {}  # job id -> a state not told yet, and since when
        self._news: dict[str, list[str]] = {}  # job id -> "created", "resumed" read, not told yet
        self._own_created: dict[str, None] = {}  # jobs this process announced (their creation is told)
        self._own_resumes: dict[str, int] = {}  # job id -> resumes this process announced, not read yet
        self._after = 0  # the next read's start: the cursor before the last read's (each row is read twice:
        self._cursor = 0  # on PostgreSQL a row may commit after a newer one was read), and the last cursor
        self._read: set[int] = set()  # rows handled, after ``_after``
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, bus: Any) -> ElsewhereWatcher:
        bus.subscribe(self.on_event)
        return self

    def on_event(self, event: EngineEvent) -> None:
        """This process announced a change of the job: its state now is told already."""
        if not event.job_id or event.kind not in ANNOUNCED:
            return
        try:
            state = str(self.engine.get_job(event.job_id).state)
        except Exception:  # noqa: BLE001 - telling never fails the engine
            return
        with self._lock:
            if self._known is None:
                return
            self._known[event.job_id] = state
            self._ended.pop(event.job_id, None)
            if event.kind in CREATION:
                self._own_created[event.job_id] = None
                while len(self._own_created) > MAX_ENDED:
                    self._own_created.pop(next(iter(self._own_created)))
            if event.kind == K.resumed:
                self._own_resumes[event.job_id] = self._own_resumes.get(event.job_id, 0) + 1

    def _read_changes(self) -> set[str]:
        """The jobs the store says changed since the last read (their news noted): one indexed read."""
        changes = self.engine.job_changes(after=self._after)
        touched: set[str] = set()
        with self._lock:
            for change in changes.changes:
                if change.id in self._read:
                    continue
                self._read.add(change.id)
                touched.add(change.job_id)
                if change.what in ("created", "resumed"):
                    self._news.setdefault(change.job_id, []).append(change.what)
            cursor = max(self._cursor, changes.cursor)
            self._after = cursor if changes.more else self._cursor  # a flood: read on, no overlap
            self._cursor = cursor
            self._read = {i for i in self._read if i > self._after}
        return touched

    def _unexplained(self, job_id: str) -> list[str]:
        """The job's news this process did not announce itself (its creation, its resumes)."""
        kept: list[str] = []
        for what in self._news.pop(job_id, []):
            if what == "created" and job_id in self._own_created:
                del self._own_created[job_id]
            elif what == "resumed" and self._own_resumes.get(job_id, 0) > 0:
                self._own_resumes[job_id] -= 1
                if not self._own_resumes[job_id]:
                    del self._own_resumes[job_id]
            else:
                kept.append(what)
        if kept:
            self._news[job_id] = kept
        return kept

    def poll(self) -> list[str]:
        """Read what happened to the jobs once; tell (and return) the changes made elsewhere that settled."""
        now = self.clock()
        with self._lock:
            first = self._known is None
        if first:  # the first read: what was there before this process is not news
            cursor = self.engine.job_changes().cursor  # before the listing: a change between is read again
            views = self.engine.list_jobs(active_only=True)
            with self._lock:
                self._known = {v.job_id: str(v.state) for v in views}
                self._after = self._cursor = cursor
            return []
        touched = self._read_changes()
        with self._lock:
            ids = touched | set(self._seen) | set(self._news)
        views: dict[str, Any] = {}
        for job_id in sorted(ids):
            try:
                views[job_id] = self.engine.get_job(job_id)
            except Exception:  # noqa: BLE001 - gone or unreadable: nothing to tell
                continue
        told: list[tuple[str | None, Any, list[str]]] = []
        with self._lock:
            known = self._known
            assert known is not None
            for job_id, view in views.items():
                state = str(view.state)
                if job_id not in known and job_id in self._ended:
                    known[job_id] = self._ended.pop(job_id)  # ended before, changed again (a resume)
                news = self._unexplained(job_id)
                if known.get(job_id) == state and not news:
                    self._seen.pop(job_id, None)
                    continue
                since = self._seen.get(job_id)
                if since is None or since[0] != state:
                    self._seen[job_id] = (state, now)  # told once it has settled: this process may say it
                    continue
                if now - since[1] >= self.settle_s:
                    told.append((known.get(job_id), view, news))
                    known[job_id] = state
                    self._seen.pop(job_id, None)
                    self._news.pop(job_id, None)
            for job_id in [j for j, s in known.items() if s in FINAL]:
                self._ended[job_id] = known.pop(job_id)  # ended and told: no longer read every time
            while len(self._ended) > MAX_ENDED:
                self._ended.pop(next(iter(self._ended)))
        lines = [self._line(before, view, news) for before, view, news in told]
        for (_, view, _), line in zip(told, lines, strict=True):
            self.console.print(f"[dim]\\[{view.job_id}][/dim] " + markup(line), highlight=False)
        return lines

    @staticmethod
    def _line(before: str | None, view: Any, news: list[str] | tuple[str, ...] = ()) -> str:
        state = str(view.state)
        ended = state in FINAL
        began = "resumed" if "resumed" in news else "launched" if "created" in news else None
        if began == "launched" and state == "pending_approval":
            what = "waits for approval"
        elif began is not None:
            what = began  # and, where it ended since, "and ended" below
        elif before is None:
            what = "waits for approval" if state == "pending_approval" else "launched"
        elif before in ("stopped", "failed") and not ended:
            what = "resumed"
        elif before == "pending_approval" and not ended:
            what = "approved"
        elif state == "running" and before in ("approved", "launching"):
            what = "started"
        elif ended:
            what = "ended"
        else:
            what = f"{before} -> {state}"
        running = state == "running" and view.provider
        shown = view.provider and (running or (ended and what in ("launched", "resumed")))
        where = f" on {view.provider} {view.gpu or ''} x{view.gpu_count or 1}" if shown else ""
        price = f" at {cards.money(view.price_per_hour)}/h" if running and view.price_per_hour else ""
        then = " and ended" if ended and what in ("launched", "resumed") else ""
        steps = f"step {view.step}" + (f"/{view.max_steps}" if view.max_steps else "")
        return (
            f":arrow_forward: Job {view.job_id} of {view.owner} {what} by another process{where}{price}"
            f"{then}: {state} · {steps} · {cards.money(view.spend)}"
        )

    def start(self) -> ElsewhereWatcher:
        self._thread = threading.Thread(target=self._run, name="elsewhere-watcher", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - keep watching; the next read may succeed
                log.exception("reading the jobs' states failed")
            if self._stop.wait(self.every_s):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


class _LogLines(io.TextIOBase):
    """A text stream whose every line becomes an INFO record of ``logger`` (a rich Console writes to it)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if line.strip():
                self.logger.info(line.rstrip())
        return len(text)


def log_notifier(engine: EngineAPI, *, progress_every_s: float = 30.0) -> ConsoleNotifier:
    """What the console prints as a job goes (progress, milestones, alerts, summaries, reminders), as log
    lines of ``tunebot.jobs``: `tunebot serve` without Slack writes there what would go to a job's thread."""
    stream = _LogLines(logging.getLogger("tunebot.jobs"))
    console = Console(file=stream, width=200, soft_wrap=True, color_system=None, force_terminal=False)
    return ConsoleNotifier(engine, console, progress_every_s=progress_every_s)


def _answers(buttons: list[Any]) -> dict[str, str]:
    """Console answers for the launch buttons: `cheapest`, `safest`, ... and `yes` for the first."""
    out: dict[str, str] = {}
    for b in buttons:
        if b.action.startswith("launch_"):
            choice = b.action.removeprefix("launch_")
            out[choice] = choice
            out.setdefault("yes", choice)
            out.setdefault("y", choice)
    return out


class ConsoleSession:
    def __init__(
        self,
        chat: ChatHandlers,
        console: Console,
        *,
        user: str = CONSOLE_USER,
        echo: bool = True,
    ) -> None:
        self.chat = chat
        self.console = console
        self.actor = Actor(user, None, operator=True)  # the console's person runs the bot
        self.echo = echo
        self.last_job_id: str | None = None

    def say(self, reply: Reply) -> None:
        render(reply, self.console)

    def run(self, lines: Iterable[str]) -> int:
        """Execute every command; returns 0 (errors are replies, not exit codes)."""
        stream = iter(lines)
        for raw in stream:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.lower() in ("exit", "quit", "/exit", "/quit"):
                break
            self.execute(line, stream)
        return 0

    def execute(self, line: str, stream: Iterator[str] | None = None) -> Reply:
        if self.echo:
            self.console.print(f"[bold cyan]{PROMPT}[/bold cyan]{markup(line)}", highlight=False)
        try:
            command = parse(line)
        except ParseError as exc:
            reply = error_reply(exc.message, exc.usage)
            self.say(reply)
            return reply
        if isinstance(command, ApproveCmd):
            reply = self.chat.approve(command.job_id, self.actor)
        else:
            reply = self.chat.handle(command, self.actor)
        self.say(reply)
        if isinstance(command, LaunchCmd | CloneCmd | SweepCmd) and reply.buttons:
            return self._confirm(reply, stream)
        return reply

    def _confirm(self, reply: Reply, stream: Iterator[str] | None) -> Reply:
        answers = _answers(reply.buttons)
        estimate_id = next(b.value for p in reply.parts if isinstance(p, Buttons) for b in p.buttons)
        question = f"Launch? [{'/'.join(k for k in answers if k not in ('yes', 'y'))}/no] "
        self.console.print(f"[bold]{escape(question)}[/bold]", end="")
        answer = ""
        if stream is not None:
            answer = next(stream, "").strip().lower()
        self.console.print(answer, highlight=False)
        if answer not in answers:
            result = self.chat.cancel_estimate(estimate_id, self.actor)
        else:
            result = self.chat.launch(estimate_id, answers[answer], self.actor)
        self.say(result)
        return result


class Ticker:
    """Calls ``engine.tick()`` every few seconds in a thread (the console has no scheduler of its own)."""

    def __init__(self, tick: Callable[[], Any], every_s: float = 2.0) -> None:
        self.tick = tick
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-ticker", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - keep ticking; the next pass may succeed
                log.exception("engine tick failed")

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
