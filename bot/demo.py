"""`tunebot demo`: the whole product on this machine in about a minute, as a scripted console session.

It makes a tiny model and dataset, starts the engine on SQLite with the local provider (the runner
as a process on this CPU), then types into the console: an estimate, a launch, progress with the
loss, a simulated spot preemption and its recovery from the last checkpoint, the finish with the
adapter path, the cost and what it bought (the eval loss of the base model before training and of the
result after, on the same held-out data, and both models' answers side by side), a second run with another
learning rate and the two compared, the daily spend summary and an idle-volume reminder. It saves the loss
chart and the comparison chart as PNGs and exits 0 when the jobs succeeded.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from bot.chat.charts import training_chart
from bot.chat.console import ConsoleNotifier, ConsoleSession
from bot.chat.handlers import ChatHandlers
from bot.chat.permissions import Permissions
from bot.chat.terminal import markup
from bot.engine.events import EngineEventKind
from bot.engine.record.jobstate import FINAL, JobState

log = logging.getLogger(__name__)

USER = "you"
# The tiny job's training settings are ordinary request options (priced, shown on the card, passed on);
# only the cadence of checkpoints and reports is the demo's own: every few seconds instead of minutes.
JOB_OPTIONS = (
    "seq=256 batch=4 accum=1 r=8 alpha=16 dropout=0.05 lr=1e-2 warmup=5% scheduler=cosine steps=30 seed=0 "
    "plateau=no checkpointing=no eval=10% samples=2 max_cost=1"
)
# The second run: the same job with another learning rate, shorter (the demo stays fast), then compared.
SECOND_RUN = "lr=3e-3 steps=15"
DEMO_SPEC = {
    "checkpoint": {"every_minutes": 0.2, "keep": 2},
    "report": {"every_seconds": 0.5},
    "samples": {"max_new_tokens": 16},  # short answers: the tiny model's are short anyway
}
PREEMPT_AT_STEP = 3  # SIGTERM makes the runner finish its step and save a checkpoint, then exit 75
STEP_LINE = re.compile(r"^step (\d+)/", re.MULTILINE)  # the runner's progress lines: "step 3/30 | loss ..."


class Demo:
    def __init__(
        self, console: Console, workdir: Path, *, tick_s: float = 1.0, timeout_s: float = 150.0
    ) -> None:
        self.console = console
        self.workdir = workdir
        self.tick_s = tick_s
        self.deadline = time.monotonic() + timeout_s
        self.engine: Any = None
        self.local: Any = None
        self.notifier: ConsoleNotifier | None = None

    # ---- setup -----------------------------------------------------------------------------------
    def step(self, text: str) -> None:
        self.console.rule(f"[bold]{text}[/bold]", align="left")

    def setup(self) -> tuple[Path, Path]:
        from bot.providers.local import DEFAULT_RUNNER_COMMAND

        self.step("1. A tiny model and dataset, made here (no download)")
        started = time.monotonic()
        # The runner's own `make-tiny`, in its own process: the bot imports nothing of the runner but its
        # contract (and never torch).
        made = subprocess.run(
            [*DEFAULT_RUNNER_COMMAND, "make-tiny", str(self.workdir / "tiny"), "--seed", "0"],
            capture_output=True,
            text=True,
            check=True,
        )
        job_json = Path(made.stdout.strip().splitlines()[-1])
        model, data = job_json.parent / "model", job_json.parent / "data.jsonl"
        self.console.print(
            f"model   {model}\ndataset {data}  ({time.monotonic() - started:.1f} s)", highlight=False
        )

        from bot.engine.service import Engine
        from bot.providers.local import LocalProvider
        from bot.settings import Settings

        settings = Settings(TUNEBOT_DATA_DIR=str(self.workdir / "data"), TUNEBOT_HEARTBEAT_TIMEOUT=120)
        # Unbuffered runner output: the demo watches the runner's log to time the preemption.
        self.local = LocalProvider(workdir=self.workdir / "local", extra_env={"PYTHONUNBUFFERED": "1"})
        self.local.warm()  # the relaunch after the preemption and the second run fork from it
        self.engine = Engine(
            settings,
            db_url=f"sqlite:///{self.workdir / 'tunebot.db'}",
            providers={"local": self.local},
            permissions=self.policy(settings),  # the chat's and the engine's: one policy (`spend today`)
        )
        self.notifier = ConsoleNotifier(self.engine, self.console).attach(self.engine.bus)
        self.console.print("engine  SQLite + the local provider (the runner runs as a process on this CPU)")
        return model, data

    @staticmethod
    def policy(settings: Any) -> Permissions:
        """Who may do what in the demo: its person is the admin of this machine, as the console's operator
        is; the engine and the chat ask this same policy, so what the chat lets through the engine allows."""
        return Permissions(admins=frozenset({USER}), approval_above=settings.approval_above_usd)

    # ---- the loop --------------------------------------------------------------------------------
    def tick_until(
        self, done: Callable[[], bool], what: str, timeout_s: float = 90.0, poll_s: float = 0.1
    ) -> bool:
        """Tick the engine every ``tick_s`` and check ``done`` every ``poll_s`` until it holds."""
        until = min(self.deadline, time.monotonic() + timeout_s)
        next_tick = 0.0
        while time.monotonic() < until:
            if time.monotonic() >= next_tick:
                self.engine.tick()
                next_tick = time.monotonic() + self.tick_s
            if done():
                return True
            time.sleep(poll_s)
        self.console.print(f"[red]gave up waiting for {what}[/red]")
        return False

    def runner_step(self, job_id: str) -> int:
        """The runner's own latest step from its log: on a fast CPU the whole job takes a few seconds,
        so the preemption cannot wait for the engine's next pull of the progress file."""
        best = 0
        for inst in self.local.list_instances():
            if inst.job_id != job_id:
                continue
            try:
                text = self.local.log_path(inst.instance_id).read_text(errors="replace")
            except OSError:
                continue
            for match in STEP_LINE.finditer(text):
                best = max(best, int(match.group(1)))
        return best

    def seen(self, kind: EngineEventKind, job_id: str) -> int:
        assert self.notifier is not None
        return sum(1 for e in self.notifier.seen if e.kind == kind and e.job_id == job_id)

    def preempt(self, job_id: str) -> bool:
        instances = [
            i for i in self.local.list_instances() if i.job_id == job_id and i.status.value == "running"
        ]
        if not instances:
            self.console.print("[yellow]the job ended before the preemption; skipping it[/yellow]")
            return False
        self.console.print(
            markup(
                f":warning: Simulating a spot preemption at step {self.runner_step(job_id)}: "
                f"SIGTERM to instance `{instances[0].instance_id}`"
            ),
            highlight=False,
        )
        self.local.preempt(instances[0].instance_id, 20.0)
        return True

    def record_idle_volume(self) -> None:
        """A volume left over from an earlier job, idle for 5 days (the provider listing, simulated)."""
        from store.models import VolumeRecord

        now = self.engine.now()
        with self.engine.session() as s:
            s.add(
                VolumeRecord(
                    provider="local",
                    volume_id="demo-vol-1",
                    name="llama-8b-checkpoints",
                    size_gb=200.0,
                    price_per_gb_month=0.07,
                    first_seen_at=now - 12 * 86400,
                    idle_since=now - 5 * 86400,
                    owner=USER,
                    tracked=True,  # as if tunebot had created it for one of USER's jobs
                )
            )
            s.commit()

    def summary_and_reminders(self) -> None:
        """The daily summary, then the reminders about the idle volumes it counts (the volume exists before
        the summary, so its "Idle volumes" line and the reminder that follows speak of the same volume)."""
        self.record_idle_volume()
        self.engine.daily_summary(day="today")
        self.engine.volume_reminders()

    # ---- the script ------------------------------------------------------------------------------
    def run(self) -> int:
        model, data = self.setup()
        chat = ChatHandlers(
            self.engine,
            self.policy(self.engine.settings),
            job_options={"spec_overrides": DEMO_SPEC},
            chart_dir=self.workdir,
        )
        from bot.chat.cards import PROGRESS_IN_CONSOLE

        chat.progress_note = PROGRESS_IN_CONSOLE
        session = ConsoleSession(chat, self.console, user=USER)
        options = f"dataset={data} {JOB_OPTIONS}"

        self.step("2. Estimate: memory, time and cost on every offer")
        session.run([f"estimate {model} {options}"])

        self.step("3. Launch on the cheapest offer")
        session.run([f"launch {model} {options}", "cheapest"])
        jobs = self.engine.list_jobs(user=USER)
        if not jobs:
            self.console.print("[red]nothing was launched[/red]")
            return 1
        job_id = jobs[0].job_id

        self.step("4. Training: progress with the loss, pulled from the runner")
        self.tick_until(
            lambda: self.runner_step(job_id) >= PREEMPT_AT_STEP or self.engine.get_job(job_id).state in FINAL,
            f"step {PREEMPT_AT_STEP}",
        )

        self.engine.tick()  # show the progress so far before the preemption
        self.step("5. A spot preemption, and the recovery from the last checkpoint")
        if self.preempt(job_id):
            self.tick_until(
                lambda: (
                    self.seen(EngineEventKind.recovered, job_id) >= 1
                    or self.engine.get_job(job_id).state in FINAL
                ),
                "the recovery",
            )

        self.step("6. Meanwhile, the same job with another learning rate")
        second_id = self.second_run(session, job_id)

        self.step("7. The finish: adapter, cost and what it bought (eval loss before -> after, answers)")
        self.tick_until(lambda: self.engine.get_job(job_id).state in FINAL, "the finish", timeout_s=120)
        job = self.engine.get_job(job_id)
        session.run([f"status {job_id}", "spend today"])

        self.step("8. The two runs compared")
        second = self.compare(session, job_id, second_id)

        self.step("9. The daily spend summary and an idle-volume reminder")
        self.console.print(
            "A 200 GB volume left from an earlier job (made up: first seen 12 days ago, idle for 5) bills "
            "storage every day: the summary counts it beside this job's compute.",
            highlight=False,
        )
        self.summary_and_reminders()
        session.run(["volumes"])

        series = self.engine.series(job_id)
        chart = training_chart(series, self.workdir / f"loss-{job_id}.png")
        self.step("Done")
        first = series.train[0] if series.train else (0, float("nan"))
        last = series.train[-1] if series.train else (0, float("nan"))
        self.console.print(
            f"job {job_id}: {job.state}, {job.step} steps, loss {first[1]:.3f} (step {first[0]}) -> "
            f"{last[1]:.3f} (step {last[0]}), {len(series.train)} points, {job.preemptions} preemption(s) "
            f"marked at step {', '.join(map(str, series.preemptions)) or '-'}, cost ${job.spend:.4f}\n"
            f"adapter    {job.output_uri}\nloss chart {chart}",
            highlight=False,
        )
        ok = job.state == JobState.SUCCEEDED and (second is None or second.state == JobState.SUCCEEDED)
        return 0 if ok else 1

    def second_run(self, session: ConsoleSession, job_id: str) -> str | None:
        """`clone JOB lr=...`: the same data and options with another learning rate, training beside the first
        (the demo stays fast); its id."""
        before = {j.job_id for j in self.engine.list_jobs(user=USER)}
        session.run([f"clone {job_id} {SECOND_RUN}", "cheapest"])
        new = [j.job_id for j in self.engine.list_jobs(user=USER) if j.job_id not in before]
        if not new:
            self.console.print("[red]the second run was not launched[/red]")
            return None
        return new[0]

    def compare(self, session: ConsoleSession, job_id: str, second_id: str | None) -> Any:
        """Both runs ended: `compare` them (what differs, eval before -> after, cost, time, the chart)."""
        if second_id is None:
            return None
        self.tick_until(
            lambda: self.engine.get_job(second_id).state in FINAL, "the second run", timeout_s=120
        )
        session.run([f"compare {job_id} {second_id}"])
        return self.engine.get_job(second_id)

    def close(self) -> None:
        if self.engine is not None:
            try:
                for inst in self.local.list_instances():
                    self.local.terminate(inst.instance_id)
            except Exception:  # noqa: BLE001 - best effort on the way out
                log.warning("could not clean up the demo's runner processes")
            self.engine.close()


def demo_folder() -> Path:
    """A new folder for one demo's files: in TUNEBOT_DATA_DIR when it is set (the environment or .env), else
    in the temp directory. Never the data folder itself: the demo's jobs and its made-up idle volume stay out
    of the real job database."""
    from bot.settings import get_settings

    settings = get_settings()
    if "data_dir" in settings.model_fields_set:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="demo-", dir=settings.data_dir))
    return Path(tempfile.mkdtemp(prefix="tunebot-demo-"))


def run_demo(*, workdir: Path | None = None, console: Console | None = None) -> int:
    """Play the demo; returns the process exit code. Its files (chart, adapter) stay in ``workdir``."""
    if console is None:  # piped: lines are not wrapped, tables not squeezed (what scripts and tests read)
        from bot.chat.terminal import cli_console

        console = Console() if sys.stdout.isatty() else cli_console()
    workdir = demo_folder() if workdir is None else Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    demo = Demo(console, workdir)
    try:
        code = demo.run()
    finally:
        demo.close()
    console.print(f"demo finished in {time.monotonic() - started:.0f} s; files in {workdir}", highlight=False)
    return code
