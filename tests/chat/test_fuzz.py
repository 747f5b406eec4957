"""Fuzzing the user-facing entry points with hostile input: `tunebot estimate` (50 bad calls), the console
(300 generated lines) and signed /tune commands through the real HTTP server (300): every bad input is a
clear message (exit code 2 on the command line), never a traceback, and no typed mention comes back live.

Inputs are generated from a fixed seed: over-long names, NUL bytes, control characters, non-UTF-8 bytes,
Slack control sequences, host paths, and broken key=value words in every slot.
"""

from __future__ import annotations

import io
import logging
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.worlds import slack_world
from rich.console import Console
from typer.testing import CliRunner

from bot.chat.console import ConsoleSession
from bot.chat.escaping import live_tokens
from bot.chat.handlers import GENERIC_ERROR, ChatHandlers
from bot.chat.permissions import Permissions
from bot.planner.sources import SourcePolicy
from bot.settings import Settings

MENTIONS = ["<!channel>", "<!here>", "<@U0HOSTILE|boss>", "<!subteam^S0X|@t>", "<https://evil.example|click>"]
NASTY = [
    "x" * 300,
    "y" * 5000,
    "a/" + "b" * 256,
    "llama\x00.json",
    "data\x00.jsonl",
    "\x1b[31mred",
    "bell\x07",
    "cr\rlf\n",
    "tab\tx",
    "\u202eevil",
    "/etc/passwd",
    "../../etc/shadow",
    "~root/.ssh/id_rsa",
    "file:///etc/passwd",
    "http://169.254.169.254/latest",
    "s3://",
    "",
    "=",
    "'",
    '"',
    "\\",
    "%s%n",
    "{0}",
    "[bold]x[/bold]",
    "*bold*",
    "`code`",
    "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B",
    *MENTIONS,
]
KEYS = [
    "dataset",
    "tokens",
    "seq",
    "gpu",
    "method",
    "gpus",
    "lr",
    "max_cost",
    "format",
    "push_to_hub",
    "nokey",
]
VERBS = [
    "estimate",
    "launch",
    "status",
    "stop",
    "approve",
    "spend",
    "gpus",
    "budget set team",
    "jobs",
    "help",
]


def word(rng: random.Random) -> str:
    parts = [rng.choice(NASTY) for _ in range(rng.randint(1, 2))]
    return "".join(parts)


def line(rng: random.Random) -> str:
    verb = rng.choice(VERBS)
    words = [verb, word(rng)]
    for _ in range(rng.randint(0, 3)):
        words.append(f"{rng.choice(KEYS)}={word(rng)}")
    return " ".join(words)


def assert_clean(texts: list[str]) -> None:
    for text in texts:
        assert "Traceback" not in text, text[-2000:]
        assert GENERIC_ERROR not in text, text[-2000:]
        assert not live_tokens(text), (live_tokens(text), text[:500])


@pytest.fixture
def real_engine(tmp_path: Path) -> Iterator[object]:
    from bot.engine.service import Engine

    (tmp_path / "data").mkdir()
    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "state"), TUNEBOT_HF_OFFLINE="1")
    engine = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={})
    yield engine
    engine.close()


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBOT_HF_OFFLINE", "1")  # hub ids resolve from the table or fail at once


def test_300_console_lines_no_traceback(
    real_engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(13)
    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None)
    chat = ChatHandlers(real_engine, Permissions(admins=frozenset({"console"})), secrets=[])
    session = ConsoleSession(chat, console, user="console", echo=True)
    lines = [line(rng) for _ in range(300)]
    with caplog.at_level(logging.WARNING):
        for text in lines:
            session.execute(text.replace("\n", " "), iter(["no"]))
    printed = out.getvalue()
    assert "Traceback" not in printed and GENERIC_ERROR not in printed
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], [
        r.getMessage()[:300] for r in caplog.records if r.levelno >= logging.ERROR
    ]


def cli_cases() -> list[list[str]]:
    rng = random.Random(36)
    cases: list[list[str]] = [
        ["x" * 300],
        ["llama-3.1-8b", "dataset=/" + "d" * 300],
        ["llama-3.1-8b", "--dataset", "a/" + "b" * 4000],
        ["llama\x00"],
        ["llama-3.1-8b", "dataset=\x00"],
        ["llama-3.1-8b", "tokens=\x00"],
        ["\x1b[2J"],
        ["llama-3.1-8b", "seq=\x07"],
        ["llama\udcff\udcfe"],  # non-UTF-8 bytes as Python decodes argv
        ["llama-3.1-8b", "dataset=\udcffdata.jsonl"],
        ["llama-3.1-8b", "nokey"],
        ["llama-3.1-8b", "=x"],
        ["llama-3.1-8b", "tokens=20M", "dataset=/etc/passwd"],
        ["llama-3.1-8b", "dataset=/no/such/file.jsonl"],
        ["[bold]x[/bold]"],
    ]
    while len(cases) < 50:
        args = [word(rng)]
        for _ in range(rng.randint(1, 3)):
            args.append(f"{rng.choice(KEYS)}={word(rng)}")
        cases.append(args)
    return cases


def test_50_bad_estimate_calls_exit_2_without_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.cli import app

    monkeypatch.setenv("TUNEBOT_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    for args in cli_cases():
        result = runner.invoke(app, ["estimate", *args])
        assert result.exit_code == 2, (args, result.exit_code, repr(result.exception), result.output[-500:])
        assert "Traceback" not in result.output and isinstance(result.exception, SystemExit | None), args
        assert "error" in result.output.lower() or "usage" in result.output.lower(), (args, result.output)


def test_real_process_with_non_utf8_and_overlong_arguments(tmp_path: Path) -> None:
    env = {**os.environ, "TUNEBOT_DATA_DIR": str(tmp_path), "TUNEBOT_HF_OFFLINE": "1"}
    tunebot = [sys.executable, "-m", "bot.cli"]
    for args in ([b"llama\xff\xfe"], [b"llama-3.1-8b", b"dataset=\xffx.jsonl"], [b"n" * 300]):
        proc = subprocess.run([*tunebot, "estimate", *args], env=env, capture_output=True, timeout=120)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr[-1000:])
        assert b"Traceback" not in proc.stderr + proc.stdout


def test_300_signed_slash_commands_over_http(tmp_path: Path, real_engine) -> None:
    rng = random.Random(300)
    sources = SourcePolicy(data_dir=tmp_path / "data")
    with slack_world(
        real_engine,
        admins=("U0ADMIN",),
        notifier=False,
        sources=sources,
        record_runner_event=lambda *a: False,
    ) as stack:
        slack = stack.slack
        acks: list[str] = []
        slow = 0
        for i in range(300):
            text: str | bytes = line(rng)
            if i % 10 == 0:  # raw bytes that are not UTF-8, as a broken client may send them
                text = text.encode() + b" dataset=\xff\xfe"
            resp = stack.command(text, user="U0FUZZ")  # type: ignore[arg-type]
            assert resp.status_code == 200, resp.text
            acks.append(resp.text)
            body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
            if str(body.get("text", "")).startswith(":hourglass:"):
                slow += 1
        slack.wait_for("response", slow, timeout=120)
        time.sleep(0.3)
        import json

        assert_clean(acks + [json.dumps(m) for m in slack.messages()])
