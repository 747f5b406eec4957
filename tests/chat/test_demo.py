"""`tunebot demo` end to end: the scripted console session on the local provider (how long it takes is the
demo's own "demo finished in N s" line: output, not something a test on a shared machine can promise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.providers.registry import CLOUDS

FAKE_SECRETS = {
    **{spec.key_env: f"{name}-DEMO-KEY-{i:02d}b{i:02d}c" for i, (name, spec) in enumerate(CLOUDS.items())},
    "SLACK_BOT_TOKEN": "xoxb-DEMO-BOT-TOKEN-2a3b",
    "SLACK_APP_TOKEN": "xapp-DEMO-APP-TOKEN-4c5d",
    "SLACK_SIGNING_SECRET": "DEMO-SIGNING-SECRET-6e7f",
    "HF_TOKEN": "hf_DEMO_TOKEN_8a9b",
}


@pytest.mark.slow
def test_demo_runs_the_whole_story_and_leaks_nothing(tmp_path: Path) -> None:
    env = {**os.environ, **FAKE_SECRETS, "TUNEBOT_DATA_DIR": str(tmp_path / "home"), "COLUMNS": "120"}
    # The demo must not reach the clouds even with keys set: point them at a closed loopback port.
    for spec in CLOUDS.values():
        env[spec.url_env] = "http://127.0.0.1:9/"
    workdir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-c", "from bot.cli import main; main()", "demo", "--dir", str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,  # against a hang, not a speed claim (under pytest's own 600 s limit)
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for needle in (
        "tunebot> estimate",
        "Offers ranked by expected total cost",
        "Launch? [cheapest/safest/no] cheapest",
        "loss",
        "Simulating a spot preemption",
        "Preempted at step",
        "Recovered:",
        "Finished at step 30",
        "Adapter:",
        "cost $",
        "Daily spend summary",
        "llama-8b-checkpoints",
        "$14.00/month",
        "Delete | Keep",
        "(step 1) ->",  # the chart's data starts at the first step, not at the first report
        "1 preemption(s) marked at step",
        "Side by side: job",  # both models' answers to the same prompts
        "2 runs side by side",  # the second run, compared
        "lowest eval loss:",
    ):
        assert needle in out, needle
    assert "Traceback" not in out
    # the demo's own `spend today` answers (its person is the admin the chat and the engine both know)
    assert "tunebot> spend today" in out and "Spend today" in out and "Not allowed" not in out, out[-3000:]
    import re

    # What the money bought, on the finish line: eval loss before and after, on the same held-out data.
    assert re.search(r"Eval loss \d+\.\d+ -> \d+\.\d+ \([+-]\d+%\) for \$", out), out[-3000:]
    assert re.search(r"demo finished in \d+ s; files in", out), out[-3000:]  # said, not promised
    chart = workdir.glob("loss-*.png")
    png = next(chart)
    assert png.read_bytes().startswith(b"\x89PNG") and str(png) in out.replace("\n", "")
    adapters = list(workdir.glob("data/jobs/*/runs/*/output/adapter_model.safetensors"))
    assert adapters
    # Job tokens: the runner keeps its spec (with the report token) next to the checkpoints.
    tokens = {
        json.loads(p.read_text())["report"]["token"]
        for p in workdir.glob("data/jobs/*/runs/*/checkpoints/*/job.json")
    } - {None, "***"}
    for secret in [*FAKE_SECRETS.values(), *tokens]:
        assert secret not in out, f"secret {secret[:6]}... leaked"


def test_demo_summary_counts_the_idle_volume_its_reminder_names(tmp_path: Path) -> None:
    """Step 7 of the demo: the daily summary's idle-volume count and the reminder after it agree (the
    summary used to say "Idle volumes: 0" right before reminding about an idle volume)."""
    import io

    from rich.console import Console

    from bot.chat.console import ConsoleNotifier
    from bot.demo import Demo
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from bot.settings import Settings

    buf = io.StringIO()
    console = Console(file=buf, width=160, force_terminal=False, color_system=None)
    demo = Demo(console, tmp_path)
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    demo.local = LocalProvider(workdir=tmp_path / "local")
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    demo.engine = Engine(settings, db_url=db_url, providers={"local": demo.local})
    demo.notifier = ConsoleNotifier(demo.engine, console).attach(demo.engine.bus)
    try:
        demo.summary_and_reminders()
    finally:
        demo.engine.close()
    out = " ".join(buf.getvalue().split())
    summary = out.index("Daily spend summary")
    reminder = out.index("Volume llama-8b-checkpoints")
    assert summary < reminder, out
    assert "Idle volumes: 1 ($14.00/month)" in out[summary:reminder], out
    assert "Idle volumes: 0" not in out


def test_the_demo_keeps_its_files_in_the_data_folder_when_one_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: `tunebot demo` ignored TUNEBOT_DATA_DIR (its files went to the temp directory)."""
    import io

    from rich.console import Console

    import bot.demo as demo
    from bot.settings import get_settings

    seen: list[Path] = []
    monkeypatch.setattr(demo.Demo, "run", lambda self: seen.append(self.workdir) or 0)
    monkeypatch.setattr(demo.Demo, "close", lambda self: None)
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(home))
    get_settings.cache_clear()
    buf = io.StringIO()
    assert demo.run_demo(console=Console(file=buf, width=300)) == 0
    (first,) = seen
    assert first.parent == home and first.name.startswith("demo-")  # its own folder, not the data folder
    assert f"files in {first}" in buf.getvalue()
    monkeypatch.delenv("TUNEBOT_DATA_DIR")
    get_settings.cache_clear()
    assert demo.run_demo(console=Console(file=io.StringIO(), width=300)) == 0
    assert not seen[1].is_relative_to(home)  # unset: a temp folder, as before


def test_the_demo_summary_says_where_its_money_came_from(tmp_path: Path) -> None:
    """Issue 27: the demo's summary said today's spend was $0.0005 and the month's $0.09 with no word on
    where the rest came from (the made-up idle volume's storage, billed since it was first seen)."""
    import io

    from rich.console import Console

    from bot.chat.console import ConsoleNotifier
    from bot.demo import Demo
    from bot.engine.service import Engine
    from bot.providers.local import LocalProvider
    from bot.settings import Settings

    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False, color_system=None)
    demo = Demo(console, tmp_path)
    demo.local = LocalProvider(workdir=tmp_path / "local")
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    demo.engine = Engine(
        settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"local": demo.local}
    )
    demo.notifier = ConsoleNotifier(demo.engine, console).attach(demo.engine.bus)
    try:
        demo.summary_and_reminders()
        summary = demo.engine.daily_summary(day="today")
    finally:
        demo.engine.close()
    assert summary.storage_month == summary.spent_month > 0  # no job ran: it is all the volume's storage
    out = " ".join(buf.getvalue().split())
    assert "month to date $" in out and "(compute $0.00, volume storage $" in out, out
