"""Engine events -> Slack: the job thread, its status card, milestones, charts, DMs, summaries, reminders.

The EventBus calls ``enqueue`` from engine threads; one worker thread drains the queue with a sync
WebClient (RateLimitErrorRetryHandler honours Retry-After), so a slow or failing Slack never slows
the engine. The job's thread root *is* its status card: posted once with chat.postMessage (its ts is
kept with ``EngineAPI.set_thread``) and edited in place with chat.update, at most every
``update_every_s`` for progress (milestones update it at once). Milestones are thread replies; the
loss chart is uploaded with files_upload_v2 at milestones (rate-limited) and at the end.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slack_sdk.errors import SlackApiError

from bot.chat import cards
from bot.chat.blockkit import Names, to_message
from bot.chat.escaping import esc, mention
from bot.chat.replies import Context, Fields, Header, Reply, Table, Text
from bot.chat.weekly import weekly_reply
from bot.engine.api import DailySummary, EngineAPI, JobView, VolumeView, WeeklyReport
from bot.engine.events import EngineEvent, EngineEventKind

log = logging.getLogger(__name__)

K = EngineEventKind
MILESTONES = {
    K.job_started,
    K.checkpoint,
    K.preempted,
    K.out_of_memory,
    K.start_retry,
    K.recovered,
    K.plateau,
    K.finished,
    K.failed,
    K.stopped,
    K.resumed,
    K.link,
    K.warning,
}
FINAL = {K.plateau, K.finished, K.failed, K.stopped}
# A job's state changed: App Home (its owner's, the admins') shows something else now.
HOME_CHANGES = {K.job_created, K.approval_needed, K.job_started, K.preempted, K.recovered} | FINAL
CHART_AT = {K.checkpoint, K.preempted, K.recovered} | FINAL
NOT_POSTABLE = ("not_in_channel", "channel_not_found", "is_archived")
SWEEP_QUIET = {
    K.job_created,
    K.progress,
    K.approval_needed,
}  # a sweep's runs: no thread, no card of their own


def milestone_text(event: EngineEvent, job: JobView | None) -> str:
    """One sentence per milestone, with the numbers a person wants (step, loss, cost, reason)."""
    d = event.data
    step = d.get("step", job.step if job else 0)
    loss = d.get("loss", job.loss if job else None)
    loss_s = f"{loss:.4f}" if isinstance(loss, int | float) else "-"
    spend = d.get("spend", job.spend if job else None)
    msg = esc(event.message.strip())  # engine text may quote a model, a path or a provider message
    note = f" {esc(d['note'])}" if d.get("note") else ""
    if event.kind == K.job_started:
        if d.get("resumed_from_step") is not None:  # a resumed job's first start: a resume, not a recovery
            return f":arrow_forward: Resumed: {msg}" if msg else f":arrow_forward: Resumed at step {step}."
        if msg:
            return f":rocket: {msg}"
        where = esc(f" on {job.provider} {job.gpu} x{job.gpu_count or 1}") if job and job.provider else ""
        price = f" at {cards.money(job.price_per_hour)}/h" if job and job.price_per_hour is not None else ""
        return f":rocket: Started{where}{price}."
    if event.kind == K.checkpoint:
        return f":floppy_disk: Checkpoint saved at step {step} (loss {loss_s})."
    if event.kind == K.preempted:
        return f":warning: Preempted at step {step}: " + (
            msg or "the instance was reclaimed; relaunching and resuming from the last checkpoint."
        )
    # what happened and what the bigger GPU costs (bot/engine/watching/grow.py)
    if event.kind == K.out_of_memory:
        return f":arrow_up: Out of GPU memory at step {step}: {msg}"
    if event.kind == K.start_retry:
        return f":hourglass: {msg}"
    if event.kind == K.recovered:
        return ":white_check_mark: Recovered: " + (msg or f"resumed from step {step}.")
    bought = cards.result_line(job, spend) if job is not None else None
    bought_s = f" {bought[0].upper()}{bought[1:]}." if bought else ""
    if event.kind == K.plateau:
        return (
            f":chart_with_downwards_trend: Loss plateaued at {loss_s} (step {step}); stopped early. "
            f"Cost *{cards.money(spend)}*.{bought_s}{note}"
        )
    if event.kind == K.finished:
        out = d.get("output_uri") or (job.output_uri if job else None)
        return (
            f":white_check_mark: Finished at step {step}, final loss {loss_s}, cost *{cards.money(spend)}*."
            + bought_s
            + (f" Adapter: `{esc(out)}`" if out else "")
            + note
        )
    if event.kind == K.warning:
        return f":warning: {msg}"
    if event.kind == K.resumed:
        return f":arrow_forward: {msg}"
    if event.kind == K.link:
        return f":bar_chart: {esc(d.get('name') or 'Link')}: {esc(d.get('url') or '') or msg}"
    if event.kind == K.failed:
        reason = msg or esc(job.message if job and job.message else "") or "unknown reason"
        return f":x: Failed: {reason}" + ("" if "Spend" in reason else f" (spend {cards.money(spend)}).")
    if event.kind == K.stopped:
        reason = esc(d.get("reason") or (job.stop_reason if job else None) or "user")
        return ":octagonal_sign: " + (
            msg or f"Stopped ({reason}) at step {step}; spend {cards.money(spend)}."
        )
    return msg or event.kind.value


def volume_from_event(event: EngineEvent, engine: EngineAPI) -> VolumeView | None:
    d = event.data
    try:
        return VolumeView.model_validate(d)
    except Exception:  # noqa: BLE001 - fall back to the engine's list
        pass
    vid = d.get("volume_id")
    return next((v for v in engine.volumes() if v.volume_id == vid), None) if vid else None


def _of_which(total: float, storage: float) -> str:
    """An amount, and what it is made of when volumes' storage is part of it ("$1.62 (compute $0.0028,
    volume storage $1.62)"): a summary never shows money without saying where it came from."""
    if storage <= 0:
        return cards.money(total)
    compute = max(0.0, total - storage)
    return f"{cards.money(total)} (compute {cards.money(compute)}, volume storage {cards.money(storage)})"


def summary_text(summary: DailySummary) -> str:
    """The daily summary in one sentence (the message's notification text, and its footer)."""
    done = ", ".join(f"{n} {state}" for state, n in sorted(summary.finished.items())) or "none"
    top = ", ".join(f"{line.key} {cards.money(line.amount)}" for line in summary.by_user) or "nobody"
    return (
        f"Spend on {summary.day}: {_of_which(summary.spent, summary.storage)}; today so far "
        f"{_of_which(summary.spent_today, summary.storage_today)}; month to date "
        f"{_of_which(summary.spent_month, summary.storage_month)}. "
        f"Top: {top}. Jobs finished: {done}. Active: "
        f"{summary.active}, awaiting approval: {summary.pending_approval}. Idle volumes: "
        f"{summary.idle_volumes} ({cards.money(summary.idle_volume_cost_per_month)}/month)."
    )


def summary_reply(event: EngineEvent, engine: EngineAPI) -> Reply:
    """The daily summary: yesterday, today, month to date, by user and provider, against budgets."""
    summary = DailySummary.model_validate(event.data["summary"])
    text = summary_text(summary)
    reply = Reply(fallback=esc(text))
    reply.add(Header(f"Daily spend summary for {esc(summary.day)}: {cards.money(summary.spent)}"))
    fields = [
        ("Today so far", _of_which(summary.spent_today, summary.storage_today)),
        ("Month to date", _of_which(summary.spent_month, summary.storage_month)),
        ("Active jobs", str(summary.active)),
        ("Awaiting approval", str(summary.pending_approval)),
    ]
    if summary.idle_volumes:
        idle_cost = cards.money(summary.idle_volume_cost_per_month)
        fields.append(("Idle volumes", f"{summary.idle_volumes} ({idle_cost}/month)"))
    reply.add(Fields(fields))
    for title, lines in (("By user", summary.by_user), ("By provider", summary.by_provider)):
        if lines:
            show = mention if title == "By user" else esc
            rows = [[show(line.key), cards.money(line.amount)] for line in lines]
            reply.add(Table([title.split()[-1], "spend"], rows, title=title))
    reply.add(Context([esc(text)]))
    reply.public = True
    budgets = engine.budgets()
    if budgets:
        over = [
            b
            for b in budgets
            if (b.daily and b.spent_today >= b.daily) or (b.monthly and b.spent_month >= b.monthly)
        ]
        reply.add(*cards.budgets_reply(budgets).parts[1:])
        if over:
            reply.add(
                Text(":warning: Over budget: " + ", ".join(f"{esc(b.scope)} *{esc(b.name)}*" for b in over))
            )
    return reply


class SlackNotifier:
    def __init__(
        self,
        engine: EngineAPI,
        client: Any,  # slack_sdk.WebClient
        *,
        summary_channel: str | None = None,
        admins: list[str] | None = None,
        approval_above: float = 50.0,
        update_every_s: float = 3.0,
        chart_every_s: float = 300.0,
        chart_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        names: Names | None = None,
        home: Any = None,
    ) -> None:
        self.engine = engine
        self.client = client
        self.home = home  # slack/home.HomePublisher: App Home refreshed when a job changes state
        self.names = names  # display names where mentions do not render (bot/chat/people.py)
        self.summary_channel = summary_channel
        self.admins = admins or []
        self.approval_above = approval_above
        self.update_every_s = update_every_s
        self.chart_every_s = chart_every_s
        # Charts are written here before each upload; a folder made here is removed by stop().
        self._own_chart_dir = chart_dir is None
        self.chart_dir = chart_dir or Path(tempfile.mkdtemp(prefix="tunebot-charts-"))
        self.clock = clock
        self._queue: queue.Queue[EngineEvent | None] = queue.Queue()
        self._last_update: dict[str, float] = {}
        self._pending: set[str] = set()
        self._last_chart: dict[str, float] = {}
        self._thread: threading.Thread | None = None

    # ---- wiring ------------------------------------------------------------------------------------
    def attach(self, bus: Any) -> SlackNotifier:
        bus.subscribe(self.enqueue)
        return self

    def enqueue(self, event: EngineEvent) -> None:
        self._queue.put(event)

    def start(self) -> SlackNotifier:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slack-notifier", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None
        if self._own_chart_dir:  # `tunebot serve` left one tunebot-charts-* folder per start in the temp dir
            import shutil

            shutil.rmtree(self.chart_dir, ignore_errors=True)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued event has been sent (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._queue.mutex:
                if self._queue.unfinished_tasks == 0:
                    return True
            time.sleep(0.02)
        return False

    def _run(self) -> None:
        while True:
            try:
                event = self._queue.get(timeout=0.5)
            except queue.Empty:
                self._flush_pending()
                continue
            try:
                if event is None:
                    self._flush_pending(force=True)
                    return
                self.process(event)
                if self._queue.empty():
                    self._flush_pending()
            except Exception:  # noqa: BLE001 - chat trouble never stops the notifier
                log.exception("could not send %s to Slack", getattr(event, "kind", "?"))
            finally:
                self._queue.task_done()

    # ---- rendering ---------------------------------------------------------------------------------
    def process(self, event: EngineEvent) -> None:
        kind = event.kind
        if self.home is not None and kind in HOME_CHANGES:
            self.home.changed(event.user)
        if kind in (K.sweep_created, K.sweep_stage, K.sweep_done):
            self._sweep(event)
            return
        sweep = self._sweep_run(event.job_id) if event.job_id and kind in MILESTONES | SWEEP_QUIET else None
        if sweep:  # a sweep's run is a line of the sweep's card, not a thread of its own
            if kind in MILESTONES:
                self._refresh_sweep(sweep)
            return
        if kind == K.job_created:
            self._ensure_thread(event)
        elif kind == K.approval_needed:
            self._approval(event)
        elif kind == K.progress:
            if event.job_id:
                self._pending.add(event.job_id)
                self._flush_pending()
        elif kind in MILESTONES:
            self._milestone(event)
        elif kind == K.budget_alert:
            alert = Reply(parts=[Text(f":moneybag: {esc(event.message)}")], fallback=esc(event.message))
            if event.job_id and event.channel and event.thread_ts:  # a job stopping: its thread says why
                self._post(event.channel, alert, thread_ts=event.thread_ts)
            elif event.user:
                self._dm(event.user, alert)
            elif self.summary_channel:  # a team budget: tell the channel
                self._post(self.summary_channel, alert)
        elif kind == K.idle_volume:
            self._idle_volume(event)
        elif kind == K.daily_summary:
            if self.summary_channel:
                self._post(self.summary_channel, summary_reply(event, self.engine))
        elif kind == K.weekly_report:
            self._weekly(event)

    def _post(self, channel: str, reply: Reply, thread_ts: str | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "channel": channel,
            "unfurl_links": False,
            **to_message(reply, names=self.names),
        }
        if thread_ts:
            kwargs["thread_ts"] = thread_ts
        return self.client.chat_postMessage(**kwargs).data  # type: ignore[no-any-return]

    def _dm(self, user: str | None, reply: Reply) -> None:
        if not user:
            return
        opened = self.client.conversations_open(users=user)
        self._post(opened["channel"]["id"], reply)

    def _ensure_thread(self, event: EngineEvent) -> JobView | None:
        if not event.job_id:
            return None
        job = self.engine.get_job(event.job_id)
        if job.thread_ts and job.channel:
            return job
        channel = job.channel or event.channel
        if not channel:
            return None  # a console job: nowhere to post
        try:  # in the channel where it was launched: the team sees the job, its card and its thread
            posted = self._post(channel, cards.job_card(job))
        except SlackApiError as exc:
            if (exc.response or {}).get("error") not in NOT_POSTABLE:
                raise
            channel, posted = self._thread_in_dm(job, channel)
        self.engine.set_thread(job.job_id, channel=posted.get("channel") or channel, thread_ts=posted["ts"])
        self._last_update[job.job_id] = self.clock()
        return self.engine.get_job(job.job_id)

    def _thread_in_dm(self, job: JobView, channel: str) -> tuple[str, dict[str, Any]]:
        """The bot may not post where the job was launched (a private channel it was not invited to): the
        thread goes to the owner's DM, with a line saying how to share it next time."""
        dm = self.client.conversations_open(users=job.owner)["channel"]["id"]
        note = (
            f":information_source: I cannot post in <#{channel}> (invite tunebot there to share jobs with "
            f"the channel), so job *{esc(job.job_id)}*'s thread is here."
        )
        self._post(dm, Reply(parts=[Text(note)], fallback=note))
        return dm, self._post(dm, cards.job_card(job))

    def _update_card(self, job: JobView) -> None:
        if not (job.channel and job.thread_ts):
            return
        message = to_message(cards.job_card(job), names=self.names)
        self.client.chat_update(channel=job.channel, ts=job.thread_ts, **message)
        self._last_update[job.job_id] = self.clock()
        self._pending.discard(job.job_id)

    def _flush_pending(self, *, force: bool = False) -> None:
        now = self.clock()
        for job_id in list(self._pending):
            if force or now - self._last_update.get(job_id, 0.0) >= self.update_every_s:
                try:
                    self._update_card(self.engine.get_job(job_id))
                except Exception:  # noqa: BLE001
                    log.exception("could not update the status card of %s", job_id)
                    self._pending.discard(job_id)

    def _milestone(self, event: EngineEvent) -> None:
        job = self._ensure_thread(event)
        if job is None or not job.thread_ts or not job.channel:
            return
        text = milestone_text(event, job)
        self._post(job.channel, Reply(parts=[Text(text)], fallback=text), thread_ts=job.thread_ts)
        samples = cards.samples_reply(job) if event.kind in (K.finished, K.plateau) else None
        if samples is not None:  # the side-by-side answers under the finish (a table block)
            self._post(job.channel, samples, thread_ts=job.thread_ts)
        self._update_card(job)
        if event.kind in CHART_AT:
            self._chart(job, final=event.kind in FINAL)

    def _chart(self, job: JobView, *, final: bool) -> None:
        now = self.clock()
        if not final and now - self._last_chart.get(job.job_id, -1e9) < self.chart_every_s:
            return
        series = self.engine.series(job.job_id)
        if len(series.train) < 2:
            return
        self._last_chart[job.job_id] = now
        from bot.chat.charts import chart_title, training_chart

        path = training_chart(series, self.chart_dir / f"{job.job_id}-training.png")
        marks = f", {len(series.preemptions)} preemption(s) marked" if series.preemptions else ""
        self.client.files_upload_v2(
            file=str(path),
            filename=path.name,
            channel=job.channel,
            thread_ts=job.thread_ts,
            title=f"{chart_title(series)}: step {series.step}",
            alt_txt=(
                f"Train{' and eval' if series.eval else ''} loss of job {job.job_id} against step, from step "
                f"{series.train[0][0]} to {series.train[-1][0]}, learning rate on the right axis{marks}"
            ),
        )

    def _sweep_run(self, job_id: str) -> str | None:
        """The sweep the job is a run of (None: a job of its own); its card is refreshed at its milestones."""
        cache: dict[str, str | None] = self.__dict__.setdefault("_sweep_of", {})
        if job_id not in cache:
            try:
                cache[job_id] = getattr(self.engine.get_job(job_id), "sweep_id", None)
            except Exception:  # noqa: BLE001 - an unknown job: its own events say so where they go
                return None
        return cache[job_id]

    def _sweep(self, event: EngineEvent) -> None:
        """A sweep's thread: its card as the root (one line per run, edited in place), each stage's decision
        and the end (the runs compared, the chart, the winner) as replies."""
        sweep_id = str(event.data.get("sweep_id") or "")
        view = self.engine.get_sweep(sweep_id)
        if not view.thread_ts:
            if not view.channel:
                return  # a console sweep: nowhere to post
            posted = self._post(view.channel, cards.sweep_card(view))
            self.engine.set_sweep_thread(
                sweep_id, channel=posted.get("channel") or view.channel, thread_ts=posted["ts"]
            )
            view = self.engine.get_sweep(sweep_id)
        assert view.channel and view.thread_ts
        if event.kind == K.sweep_created and event.data.get("approval"):
            ask = cards.sweep_approval_request(view, approvers=self.admins, threshold=self.approval_above)
            self._post(view.channel, ask, thread_ts=view.thread_ts)
            for admin in self.admins:
                if admin != view.owner:
                    self._dm(admin, ask)
        elif event.kind == K.sweep_stage:
            text = f":bar_chart: {esc(event.message)}"
            self._post(view.channel, Reply(parts=[Text(text)], fallback=text), thread_ts=view.thread_ts)
        elif event.kind == K.sweep_done:
            ids = [r.job.job_id for r in view.runs if r.job is not None]
            compare = self.engine.compare(ids, user=view.owner) if len(ids) > 1 else None
            self._post(view.channel, cards.sweep_done_reply(view, compare), thread_ts=view.thread_ts)
            if compare is not None:
                from bot.chat.charts import compare_chart

                path = compare_chart(compare, self.chart_dir / f"{sweep_id}-compare.png")
                self.client.files_upload_v2(
                    file=str(path),
                    filename=path.name,
                    channel=view.channel,
                    thread_ts=view.thread_ts,
                    title=f"Sweep {sweep_id}: eval loss of its runs",
                    alt_txt=f"Eval loss against step of the {len(ids)} runs of sweep {sweep_id}, each result "
                    "starred with its cost",
                )
        self._refresh_sweep(sweep_id)

    def _refresh_sweep(self, sweep_id: str) -> None:
        view = self.engine.get_sweep(sweep_id)
        if view.channel and view.thread_ts:
            message = to_message(cards.sweep_card(view), names=self.names)
            self.client.chat_update(channel=view.channel, ts=view.thread_ts, **message)

    def _weekly(self, event: EngineEvent) -> None:
        """The weekly report to the summary channel, and its spend-per-day chart (people by name) under it."""
        channel = self.summary_channel or event.channel
        if not channel:
            return
        report = WeeklyReport.model_validate(event.data.get("report") or {})
        posted = self._post(channel, weekly_reply(report))
        if not report.daily_by_person or report.total <= 0:
            return
        from bot.chat.charts import spend_chart

        days = [d[5:] for d in report.days]  # "12-01"
        monthly = sum(b.monthly or 0.0 for b in report.budgets if b.scope == "team")
        path = spend_chart(
            self.chart_dir / f"spend-{report.days[0]}.png",
            days,
            report.daily_by_person,
            names=self.names,
            budget_per_day=monthly / 30 if monthly else None,
            title=f"Spend per day, {report.days[0]} to {report.days[-1]}: {cards.money(report.total)}",
        )
        people = ", ".join((self.names or str)(p) for p in report.daily_by_person)
        self.client.files_upload_v2(
            file=str(path),
            filename=path.name,
            channel=channel,
            thread_ts=posted.get("ts"),
            title=f"Spend per day {report.days[0]} to {report.days[-1]}",
            alt_txt=f"Stacked bars of spend per day by person ({people}) with the running total"[:1000],
        )

    def _approval(self, event: EngineEvent) -> None:
        job = self._ensure_thread(event) or (self.engine.get_job(event.job_id) if event.job_id else None)
        if job is None:
            return
        reason = event.data.get("reason")
        reply = cards.approval_request(
            job, approvers=self.admins, threshold=self.approval_above, reason=str(reason) if reason else None
        )
        if job.channel:
            self._post(job.channel, reply, thread_ts=job.thread_ts)
        for admin in self.admins:
            if admin != job.owner:
                self._dm(admin, reply)

    def _idle_volume(self, event: EngineEvent) -> None:
        volume = volume_from_event(event, self.engine)
        if volume is None:
            return
        reply = cards.volume_reminder(volume, message=event.message)
        owner = volume.owner or event.user
        if self.summary_channel:
            self._post(self.summary_channel, reply)
        elif owner:
            self._dm(owner, reply)
