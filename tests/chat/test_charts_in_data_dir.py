"""Charts a person is pointed at are kept under TUNEBOT_DATA_DIR (issue 38): on 9a0c9c1 `compare` drew into
/tmp/tunebot-compare-* and a sweep's end into /tmp/tunebot-sweep-*, outside the data folder the operator
chose (and backs up, and cleans)."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from bot.engine.api import CompareRun, CompareView, SweepRunView, SweepView
from bot.engine.events import EngineEvent, EngineEventKind
from bot.planner.request import EstimateRequest

from .fake_engine import FakeEngine


def _charts(text: str) -> list[Path]:
    """The PNG paths a reply printed (white space out: a long path may be wrapped)."""
    return [Path(p) for p in re.findall(r"(/[^:]+?\.png)", "".join(text.split()))]


def test_compare_at_the_cli_keeps_its_chart_in_the_data_dir(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from engine.conftest import estimate_for, request
    from engine.fakes import FakeProvider

    from bot.cli import app
    from bot.engine.permissions import OPERATOR
    from bot.engine.service import Engine
    from bot.settings import get_settings

    fake = FakeProvider("fake")
    engine = Engine(get_settings(), providers={"fake": fake})
    ids = []
    for lr in (2e-4, 1e-3):
        job = engine.create_job(request(learning_rate=lr), user=OPERATOR, estimate=estimate_for(fake))
        engine.stop(job.job_id, user=OPERATOR)
        ids.append(job.job_id)
    engine.close()
    out = CliRunner().invoke(app, ["compare", *ids], env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    (chart,) = _charts(out.output)
    assert chart.is_file() and chart.parent == get_settings().data_dir / "charts", out.output


class SweepEngine(FakeEngine):
    """The FakeEngine with one finished sweep of two runs."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = [
            self.create_job(EstimateRequest(model="m", learning_rate=lr), user="me") for lr in (2e-4, 1e-3)
        ]
        now = datetime.now(UTC)
        self.sweep = SweepView(
            sweep_id="sw-1",
            owner="me",
            state="done",
            model="m",
            max_cost=1.0,
            runs=[
                SweepRunView(
                    index=i, settings={"lr": str(j.model)}, job=j, status="won" if i == 0 else "lost"
                )
                for i, j in enumerate(self.runs)
            ],
            winner=self.runs[0].job_id,
            created_at=now,
            updated_at=now,
        )

    def get_sweep(self, sweep_id: str, *, viewer: str | None = None) -> SweepView:
        return self.sweep

    def compare(self, ids: list[str], *, user: str) -> CompareView:
        return CompareView(
            runs=[CompareRun(job=self.get_job(i), eval=[(0, 3.0), (10, 2.0 + n)]) for n, i in enumerate(ids)]
        )


def test_a_sweeps_end_in_the_console_keeps_its_chart_in_the_data_dir() -> None:
    from bot.chat.console import ConsoleNotifier
    from bot.settings import get_settings

    engine = SweepEngine()
    buf = io.StringIO()
    ConsoleNotifier(engine, Console(file=buf, width=300, color_system=None)).attach(engine.bus)
    engine.bus.publish(
        EngineEvent(kind=EngineEventKind.sweep_done, message="sweep done", data={"sweep_id": "sw-1"})
    )
    (chart,) = _charts(buf.getvalue())
    assert chart.is_file() and chart.parent == get_settings().data_dir / "charts", buf.getvalue()


def test_compare_in_the_chat_keeps_its_chart_in_the_data_dir_by_default() -> None:
    """ChatHandlers given no chart folder (Slack, a console built without one) draws under the data dir."""
    from bot.chat.handlers import Actor, ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.chat.replies import Image
    from bot.settings import get_settings

    engine = SweepEngine()
    reply = ChatHandlers(engine, Permissions()).handle_text("compare j1 j2", Actor("me"))
    (chart,) = [p.path for p in reply.parts if isinstance(p, Image)]
    assert chart is not None and chart.is_file() and chart.parent == get_settings().data_dir / "charts"
