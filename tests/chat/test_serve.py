"""`tunebot serve` as a process: where it listens, what it refuses to start with, and its memory under
hostile input (measured on the server process itself: VmHWM, its peak resident memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from fakes.serve_process import BOT_TOKEN, ServeProcess, free_port, raw_post, sign, zeros
from fakes.slack_api import FakeSlack

from bot.settings import Settings


def gzip_line(mb: int) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [packer.compress(b'{"text": "')]
    block = b"a" * (1 << 20)
    parts += [packer.compress(block) for _ in range(mb)]
    return b"".join([*parts, packer.compress(b'"}\n'), packer.flush()])


def test_the_listening_address_is_loopback_unless_a_public_url_is_set() -> None:
    from bot.commands.chat_commands import listen_host

    socket_mode = {"SLACK_BOT_TOKEN": "xoxb-x", "SLACK_APP_TOKEN": "xapp-x"}
    assert listen_host(Settings(**socket_mode)) == "127.0.0.1"  # Socket Mode: only runner events listen
    assert listen_host(Settings(SLACK_SIGNING_SECRET="s")) == "127.0.0.1"
    assert listen_host(Settings(TUNEBOT_PUBLIC_URL="https://bot.example.com")) == "0.0.0.0"
    assert listen_host(Settings(TUNEBOT_PUBLIC_URL="  ")) == "127.0.0.1"


@pytest.mark.slow
def test_serve_binds_loopback_by_default_and_every_interface_with_a_public_url(tmp_path: Path) -> None:
    with FakeSlack() as slack:
        with ServeProcess(tmp_path, slack_api=slack.api_url) as server:
            assert server.listening_on() == ["127.0.0.1"], server.listening_on()
        public = {"TUNEBOT_PUBLIC_URL": "https://bot.example.com"}
        with ServeProcess(tmp_path, slack_api=slack.api_url, env=public) as server:
            assert server.listening_on() in (["0.0.0.0"], ["::"]), server.listening_on()


@pytest.mark.parametrize("secret", ["", "   "])
def test_an_empty_signing_secret_refuses_to_start_with_exit_2(tmp_path: Path, secret: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TUNEBOT_", "SLACK_"))},
        "TUNEBOT_DATA_DIR": str(tmp_path),
        "SLACK_BOT_TOKEN": "xoxb-x",
        "SLACK_SIGNING_SECRET": secret,
    }
    code = "import sys; from bot.cli import main; sys.argv[0] = 'tunebot'; main()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, "serve", "--http", "--port", str(free_port())],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("tunebot serve started with an empty signing secret")
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "SLACK_SIGNING_SECRET is set but empty" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.slow
def test_server_memory_stays_bounded_under_big_bodies_and_a_gzip_bomb(tmp_path: Path) -> None:
    with FakeSlack() as slack:
        slack.token = BOT_TOKEN
        slack.add_file("F0BOMBGZ01", "data.jsonl.gz", gzip_line(300), user="U_EVE")  # 300 KB -> a 300 MB line
        with ServeProcess(tmp_path, slack_api=slack.api_url) as server:
            start = server.peak_mb()
            runner = {"Authorization": "Bearer " + "A" * 43, "Content-Type": "application/json"}
            slack_headers = {**sign(b"something else"), "Content-Type": "application/json"}
            for path, headers, size, chunked in (
                ("/runner/events", runner, 200 << 20, False),
                ("/slack/events", slack_headers, 400 << 20, False),
                ("/slack/events", slack_headers, 200 << 20, True),
            ):
                declared = headers if chunked else {**headers, "Content-Length": str(size)}
                result = raw_post(server.port, path, declared, zeros(size), chunked=chunked, timeout=60)
                assert result["status"] in (401, 413), (path, result)
                assert result["sent"] < 32 << 20, (path, result)
            time.sleep(0.5)
            bodies = server.peak_mb() - start
            assert bodies < 30, f"peak RSS grew {bodies:.0f} MB under big bodies"
            server.command(
                "estimate llama-3.1-8b dataset=slack:F0BOMBGZ01",
                user="U_EVE",
                response_url=slack.response_url("bomb"),
            )
            reply = slack.wait_for("response", 1, timeout=120)[0].body["text"]
            assert "expands more than 100 times" in reply and "TUNEBOT_DATASET_MAX_RATIO" in reply, reply
            bomb = server.peak_mb() - start
            assert bomb < 50, f"peak RSS grew {bomb:.0f} MB under a gzip bomb"
            assert "Traceback" not in server.output()


def test_the_slack_notifier_removes_the_chart_folder_it_made() -> None:
    """Issue 27: every `tunebot serve` left a tunebot-charts-* folder in the temp directory."""
    from bot.chat.notifier import SlackNotifier

    notifier = SlackNotifier(engine=None, client=None).start()  # type: ignore[arg-type]
    folder = notifier.chart_dir
    assert folder.is_dir() and folder.name.startswith("tunebot-charts-")
    (folder / "job-training.png").write_bytes(b"png")
    notifier.stop()
    assert not folder.exists()
    given = Path(tempfile.mkdtemp())  # a folder the caller gave is the caller's
    SlackNotifier(engine=None, client=None, chart_dir=given).stop()  # type: ignore[arg-type]
    assert given.is_dir()


@pytest.mark.slow
def test_serve_keeps_the_threads_charts_in_the_data_dir_not_the_temp_directory(tmp_path: Path) -> None:
    """Issue 27: every `tunebot serve` left a tunebot-charts-* folder in the temp directory; issue 38: the
    charts belong with the rest of tunebot's files (TUNEBOT_DATA_DIR), which the operator chose."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with FakeSlack() as slack:
        with ServeProcess(tmp_path, slack_api=slack.api_url, env={"TMPDIR": str(tmp)}):  # /healthz answers
            assert (tmp_path / "data" / "charts" / "slack").is_dir()
            assert list(tmp.glob("tunebot-charts-*")) == []
    assert list(tmp.glob("tunebot-charts-*")) == []
