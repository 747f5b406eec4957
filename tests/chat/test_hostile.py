"""Hostile chat users on the real engine (real planner, SQLite): no host file is read for a Slack user, no
refusal quotes a file's content, Slack uploads are fetched through Slack's files API, and the console (the
operator) keeps its local paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
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

ALICE = Actor("U_ALICE", "C1")
CREDENTIALS = {"aws_secret_access_key_PLANTED": "wJalrXUtnFEMI/K7MDENG", "db_password_PLANTED": "hunter2"}


def text_of(reply) -> str:  # type: ignore[no-untyped-def]
    return repr(reply)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[ChatHandlers, Path, FakeSlack]]:
    from bot.engine.service import Engine

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(
        "\n".join(json.dumps({"instruction": "Say hi.", "output": "Hi there! " * 20}) for _ in range(50))
        + "\n"
    )
    (data / "creds.jsonl").write_text(json.dumps(CREDENTIALS) + "\n")  # inside, but not a dataset
    (tmp_path / "planted.jsonl").write_text(json.dumps(CREDENTIALS) + "\n")  # beside the data folder
    (data / "innocent.jsonl").symlink_to(tmp_path / "planted.jsonl")
    with FakeSlack() as slack:
        slack.token = BOT_TOKEN
        settings = Settings(
            TUNEBOT_DATA_DIR=str(tmp_path / "state"),
            TUNEBOT_CHAT_DATA_DIR=str(data),
            SLACK_BOT_TOKEN=BOT_TOKEN,
            SLACK_API_URL=slack.api_url,
        )
        engine = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={})
        chat = ChatHandlers(
            engine,
            Permissions(admins=frozenset({"U_ADMIN"})),
            secrets=settings.secrets(),
            sources=SourcePolicy.from_settings(settings),
            files=SlackFiles.from_settings(settings, make_sync_client(settings)),
        )
        yield chat, tmp_path, slack
        engine.close()


@pytest.mark.parametrize(
    "command",
    [
        "estimate llama-3.1-8b dataset=/etc/passwd",
        "estimate llama-3.1-8b dataset=file:///etc/passwd",
        "estimate llama-3.1-8b dataset=../planted.jsonl",
        "estimate llama-3.1-8b dataset={tmp}/planted.jsonl",
        "estimate llama-3.1-8b dataset=innocent.jsonl",  # a symlink out of the data folder
        "launch llama-3.1-8b dataset=/etc/passwd",
        "estimate /etc",
        "estimate /etc/passwd",
        "estimate {tmp}/planted.jsonl",
    ],
)
def test_a_slack_user_cannot_make_the_bot_read_host_files(world, command: str) -> None:
    chat, tmp, _ = world
    reply = chat.handle_text(command.format(tmp=tmp), ALICE)
    text = text_of(reply)
    assert reply.kind == "error", text
    assert "data folder" in text or "not allowed" in text
    for leaked in (
        "root:",
        "is not valid JSON",
        "PLANTED",
        "hunter2",
        "cannot tell the dataset format",
        "Traceback",
    ):
        assert leaked not in text


def test_a_file_inside_the_data_folder_that_is_no_dataset_is_refused_without_its_keys(world) -> None:
    chat, _, _ = world
    text = text_of(chat.handle_text("estimate llama-3.1-8b dataset=creds.jsonl", ALICE))
    assert "cannot tell the dataset format" in text and "PLANTED" not in text and "hunter2" not in text


def test_a_dataset_inside_the_data_folder_is_estimated(world) -> None:
    chat, _, _ = world
    reply = chat.handle_text("estimate llama-3.1-8b method=qlora dataset=train.jsonl", ALICE)
    assert reply.kind != "error", text_of(reply)
    assert "tokenizer" in text_of(reply) or "chars/4" in text_of(reply)


def test_the_console_operator_keeps_local_paths(world) -> None:
    chat, tmp, _ = world
    operator = Actor("console", None, operator=True)
    text = text_of(chat.handle_text(f"estimate llama-3.1-8b dataset={tmp}/planted.jsonl", operator))
    assert "data folder" not in text
    assert "cannot tell the dataset format" in text and "PLANTED" not in text  # still no content quoted


def test_a_file_uploaded_to_slack_is_fetched_with_the_bot_token(world) -> None:
    chat, tmp, slack = world
    rows = "\n".join(json.dumps({"text": "word " * 40}) for _ in range(30)) + "\n"
    slack.add_file("F0UPLOAD1", "my data.jsonl", rows.encode(), user="U_ALICE")
    slack.add_file("F0OTHERS1", "theirs.jsonl", rows.encode(), user="U_BOB", channels=("C_ELSEWHERE",))
    slack.add_file("F0SHARED1", "shared.jsonl", rows.encode(), user="U_BOB", channels=("C1",))
    ok = chat.handle_text("estimate llama-3.1-8b dataset=slack:F0UPLOAD1", ALICE)
    assert ok.kind != "error", text_of(ok)
    fetched = tmp / "state" / "slack-files" / "F0UPLOAD1" / "my_data.jsonl"
    assert fetched.read_text() == rows
    link = "<https://acme.slack.com/files/U_BOB/F0SHARED1/shared.jsonl|shared.jsonl>"
    assert chat.handle_text(f"estimate llama-3.1-8b dataset={link}", ALICE).kind != "error"
    refused = text_of(chat.handle_text("estimate llama-3.1-8b dataset=slack:F0OTHERS1", ALICE))
    assert "share it in this channel" in refused
    missing = text_of(chat.handle_text("estimate llama-3.1-8b dataset=slack:F0MISSING", ALICE))
    assert "not available" in missing and GENERIC_ERROR not in missing
