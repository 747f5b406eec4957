"""Hostile input through the chat on the real engine (real planner, SQLite, a fake Slack): compressed
uploads that expand, datasets bigger than a sample, URIs that climb out of an allowed prefix, job ids that
are no ids. Each refusal is a friendly reply naming the limit and its setting; memory stays bounded."""

from __future__ import annotations

import gzip
import json
import random
import re
import string
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fakes.slack_api import FakeSlack
from fakes.worlds import BOT_TOKEN

from bot.chat.handlers import GENERIC_ERROR, Actor, ChatHandlers
from bot.chat.permissions import Permissions
from bot.chat.slack.app import make_sync_client
from bot.chat.slack.files import SlackFiles
from bot.planner.sources import SourcePolicy
from bot.settings import Settings

EVE = Actor("U_EVE", "C1")


def gzip_line(mb: int) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [packer.compress(b'{"text": "')]
    block = b"a" * (1 << 20)
    parts += [packer.compress(block) for _ in range(mb)]
    return b"".join([*parts, packer.compress(b'"}\n'), packer.flush()])


def rows(n: int) -> bytes:
    """Text of varied length from a 3,000-word vocabulary: compresses like real data (about 2.5x)."""
    rnd = random.Random(n)
    words = ["".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 9))) for _ in range(3000)]
    lines = (json.dumps({"text": " ".join(rnd.choices(words, k=rnd.randint(5, 80)))}) for _ in range(n))
    return "".join(line + "\n" for line in lines).encode()


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Files:
    """A plain HTTP file server on 127.0.0.1 that records the paths it was asked for."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.paths.append(self.path)
                data = outer.files.get(self.path)
                self.send_response(200 if data is not None else 404)
                self.send_header("Content-Length", str(len(data or b"")))
                self.end_headers()
                self.wfile.write(data or b"")

            do_HEAD = do_GET  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[ChatHandlers, FakeSlack, Files]]:
    from bot.engine.service import Engine

    files = Files({"/team/data.jsonl": rows(40), "/secret.jsonl": json.dumps({"text": "PLANTED"}).encode()})
    with FakeSlack() as slack:
        slack.token = BOT_TOKEN
        settings = Settings(
            TUNEBOT_DATA_DIR=str(tmp_path / "state"),
            TUNEBOT_CHAT_STORAGE_PREFIXES=f"{files.url}/team/",
            TUNEBOT_DATASET_SAMPLE_RECORDS=500,
            SLACK_BOT_TOKEN=BOT_TOKEN,
            SLACK_API_URL=slack.api_url,
        )
        from bot.settings import get_settings

        get_settings.cache_clear()
        engine = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={})
        chat = ChatHandlers(
            engine,
            Permissions(admins=frozenset({"U_ADMIN"})),
            secrets=settings.secrets(),
            sources=SourcePolicy.from_settings(settings),
            files=SlackFiles.from_settings(settings, make_sync_client(settings)),
        )
        import bot.settings as settings_module

        original = settings_module.get_settings
        settings_module.get_settings = lambda: settings  # type: ignore[assignment]
        try:
            yield chat, slack, files
        finally:
            settings_module.get_settings = original  # type: ignore[assignment]
            engine.close()
            files.server.shutdown()


def text_of(reply) -> str:  # type: ignore[no-untyped-def]
    return repr(reply)


def test_a_gzip_bomb_upload_is_refused_with_bounded_memory(world) -> None:  # noqa: ANN001
    chat, slack, _ = world
    bomb = gzip_line(200)  # ~200 KB that expands to one 200 MB line
    slack.add_file("F0BOMBENC1", "data.jsonl", bomb, user="U_EVE", content_encoding="gzip")
    slack.add_file("F0BOMBGZ01", "data.jsonl.gz", bomb, user="U_EVE")
    reset_peak_rss()
    before = peak_rss_mb()
    sent_encoded = chat.handle_text("estimate llama-3.1-8b dataset=slack:F0BOMBENC1", EVE)
    stored_gzip = chat.handle_text("estimate llama-3.1-8b dataset=slack:F0BOMBGZ01", EVE)
    grew = peak_rss_mb() - before
    assert sent_encoded.kind == "error", text_of(sent_encoded)
    assert "came gzip-encoded" in text_of(sent_encoded)
    assert stored_gzip.kind == "error", text_of(stored_gzip)
    assert "expands more than 100 times" in text_of(stored_gzip)
    assert "TUNEBOT_DATASET_MAX_RATIO" in text_of(stored_gzip)
    assert grew < 60, f"peak RSS grew {grew:.0f} MB"  # before: a 200 MB line, then JSON of it


def test_a_long_line_is_refused_naming_the_setting(world) -> None:  # noqa: ANN001
    chat, slack, _ = world
    long_line = json.dumps({"text": "x" * (9 << 20)}).encode() + b"\n"
    slack.add_file("F0LONGLINE", "long.jsonl", rows(3) + long_line, user="U_EVE")
    reply = chat.handle_text("estimate llama-3.1-8b dataset=slack:F0LONGLINE", EVE)
    assert reply.kind == "error"
    assert re.search(
        r"long\.jsonl:4: a line is longer than 8 MiB; raise it with TUNEBOT_DATASET_MAX_LINE_MB",
        text_of(reply),
    ), text_of(reply)


def test_compressed_and_large_datasets_are_estimated_from_a_bounded_sample(world) -> None:  # noqa: ANN001
    from bot.planner.tokens import count_tokens
    from runner.contract.reading import ReadLimits

    chat, slack, _ = world
    data = rows(5000)
    slack.add_file("F0PLAIN001", "big.jsonl", data, user="U_EVE")
    slack.add_file("F0GZIP0001", "big.jsonl.gz", gzip.compress(data), user="U_EVE")
    for fid in ("F0PLAIN001", "F0GZIP0001"):
        reply = chat.handle_text(f"estimate llama-3.1-8b dataset=slack:{fid}", EVE)
        assert reply.kind != "error", text_of(reply)
        assert "from the first 500 records" in text_of(reply) and "scaled up" in text_of(reply)
        est = chat.store.get(next(reversed(chat.store._items))).estimate  # type: ignore[union-attr]
        path = chat.files.folder / fid
        whole, examples, _ = count_tokens(str(next(path.iterdir())), "x", ReadLimits())
        assert examples == 5000
        assert abs(est.time.tokens - whole) / whole < 0.05, (est.time.tokens, whole)


def test_a_uri_cannot_climb_out_of_an_allowed_http_prefix(world) -> None:  # noqa: ANN001
    chat, _, files = world
    ok = chat.handle_text(f"estimate llama-3.1-8b dataset={files.url}/team/data.jsonl", EVE)
    assert ok.kind != "error", text_of(ok)
    assert "/team/data.jsonl" in files.paths
    for trick in (
        "%2e%2e/secret.jsonl",
        "%2E%2E/secret.jsonl",
        "..%2fsecret.jsonl",
        "%2e./secret.jsonl",
        "..\\secret.jsonl",
        "/../secret.jsonl",
        "%252e%252e/secret.jsonl",
    ):
        reply = chat.handle_text(f"estimate llama-3.1-8b dataset={files.url}/team/{trick}", EVE)
        assert reply.kind == "error", (trick, text_of(reply))
        assert "PLANTED" not in text_of(reply)
    assert "/secret.jsonl" not in files.paths, files.paths  # never fetched


@pytest.mark.parametrize("bad", ["j\x00b", "j1\nERROR forged", "x" * 3000, "<!channel>"])
def test_buttons_and_commands_with_a_hostile_job_id_get_a_friendly_answer(world, bad: str) -> None:  # noqa: ANN001
    chat, _, _ = world
    for reply in (chat.stop(bad, EVE), chat.approve(bad, EVE), chat.reject(bad, EVE)):
        assert reply.kind == "error" and "is not a job id" in text_of(reply), text_of(reply)
        assert GENERIC_ERROR not in text_of(reply) and "\nERROR forged" not in text_of(reply)
    typed = chat.handle_text(f"stop {json.dumps(bad)}", EVE)
    assert typed.kind == "error" and GENERIC_ERROR not in text_of(typed)
