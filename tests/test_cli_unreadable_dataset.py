"""A dataset the bot cannot read (no storage credentials here) is the request's error: exit 2, one line, no
traceback - at every door that reads it (the CLI shown; the chat and console go through the same inputs)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bot.cli import app


def test_an_unreadable_s3_dataset_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup off this machine
    result = CliRunner().invoke(
        app, ["estimate", "llama-3.1-8b", "--offline", "--dataset", "s3://bucket/t.jsonl"]
    )
    assert result.exit_code == 2, result.output
    assert "cannot read dataset s3://bucket/t.jsonl: NoCredentialsError" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
