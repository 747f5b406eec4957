"""The source policy: what a chat user may point the bot at (pure checks on paths and URIs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.planner.models import table_lookup
from bot.planner.sources import SourceError, SourcePolicy, check_source, slack_file_id
from bot.settings import Settings


def is_name(value: str) -> bool:
    return table_lookup(value) is not None


@pytest.fixture
def policy(tmp_path: Path) -> SourcePolicy:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "secrets.jsonl").write_text('{"aws_secret_access_key": "x"}\n')  # planted beside it
    (data / "link.jsonl").symlink_to(tmp_path / "secrets.jsonl")
    (data / "etc").symlink_to("/etc")
    (tmp_path / "data-evil").mkdir()
    (tmp_path / "data-evil" / "x.jsonl").write_text("{}\n")
    return SourcePolicy(data_dir=data, storage_prefixes=("s3://team/datasets/",))


@pytest.mark.parametrize(
    "value",
    [
        "/etc/passwd",
        "file:///etc/passwd",
        "local:///etc/passwd",
        "../secrets.jsonl",
        "link.jsonl",  # a symlink inside the data folder to the planted file beside it
        "etc/passwd",  # a symlinked folder
        "~/x.jsonl",
        "~root/.ssh/id_rsa",
    ],
)
def test_paths_outside_the_data_folder_are_refused_from_chat(policy: SourcePolicy, value: str) -> None:
    with pytest.raises(SourceError, match="inside the data folder|not allowed"):
        check_source(value, "dataset", policy)


def test_the_planted_file_by_absolute_path_and_a_sibling_prefix_are_refused(policy: SourcePolicy) -> None:
    root = policy.data_dir
    assert root is not None
    for value in (str(root.parent / "secrets.jsonl"), f"{root}/../secrets.jsonl", f"{root}-evil/x.jsonl"):
        with pytest.raises(SourceError):
            check_source(value, "dataset", policy)


def test_files_inside_the_data_folder_are_allowed_resolved(policy: SourcePolicy) -> None:
    root = policy.data_dir
    assert root is not None
    assert check_source("train.jsonl", "dataset", policy) == ("local", str(root.resolve() / "train.jsonl"))
    assert check_source(str(root / "train.jsonl"), "dataset", policy)[1] == str(
        root.resolve() / "train.jsonl"
    )
    assert check_source("./sub/../train.jsonl", "dataset", policy)[1] == str(root.resolve() / "train.jsonl")


def test_without_a_data_folder_no_local_path_is_allowed(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("{}\n")
    with pytest.raises(SourceError, match="TUNEBOT_CHAT_DATA_DIR"):
        check_source(str(tmp_path / "t.jsonl"), "dataset", SourcePolicy())


def test_uris_only_under_the_storage_prefixes(policy: SourcePolicy) -> None:
    assert check_source("s3://team/datasets/a.jsonl", "dataset", policy) == (
        "uri",
        "s3://team/datasets/a.jsonl",
    )
    for value in (
        "s3://team/datasets-private/a.jsonl",  # a prefix of the prefix's name is not inside it
        "s3://team/datasets/../private/a.jsonl",
        "s3://other/a.jsonl",
        "http://169.254.169.254/latest/meta-data",
        "memory://x",
    ):
        with pytest.raises(SourceError):
            check_source(value, "dataset", policy)
    assert check_source("hf://datasets/acme/chat/train.jsonl", "dataset", policy)[0] == "hub"


def test_models_hub_ids_and_names_pass_and_local_model_paths_are_checked(policy: SourcePolicy) -> None:
    assert check_source("meta-llama/Llama-3.1-8B", "model", policy, is_name=is_name)[0] in ("hub", "name")
    assert check_source("Llama-3.1-8B", "model", policy, is_name=is_name) == ("name", "Llama-3.1-8B")
    assert check_source("no-such-model", "model", policy, is_name=is_name)[0] == "name"
    assert check_source("x/config.json", "model", policy)[1].endswith("/data/x/config.json")  # inside
    for value in ("/etc", "/etc/config.json", "../secrets.jsonl"):
        with pytest.raises(SourceError):
            check_source(value, "model", policy, is_name=is_name)


def test_the_operator_may_name_any_path_but_not_an_impossible_one() -> None:
    assert check_source("/etc/passwd", "dataset", None) == ("local", "/etc/passwd")
    for bad, why in (
        ("a" * 300, "longer than file systems allow"),
        ("x" * 2000, "too long"),
        ("data\x00.jsonl", "control characters"),
        ("data\x1b[31m.jsonl", "control characters"),
        ("data\udcff.jsonl", "control characters"),  # a non-UTF-8 byte, as Python decodes argv
        ("   ", "empty"),
    ):
        with pytest.raises(SourceError, match=why):
            check_source(bad, "dataset", None)


def test_slack_file_references() -> None:
    assert slack_file_id("slack:F0123ABCD") == "F0123ABCD"
    assert slack_file_id("https://acme.slack.com/files/U1ABC/F0123ABCD/train.jsonl") == "F0123ABCD"
    assert (
        slack_file_id("<https://files.slack.com/files-pri/T1ABC-F0123ABCD/train.jsonl|train>") == "F0123ABCD"
    )
    assert slack_file_id("https://evil.example/files/U1/F0123ABCD/x") is None
    assert slack_file_id("slack:../../etc") is None


def test_policy_from_settings(tmp_path: Path) -> None:
    settings = Settings(
        TUNEBOT_CHAT_DATA_DIR=str(tmp_path), TUNEBOT_CHAT_STORAGE_PREFIXES="s3://a/b, gs://c/"
    )
    policy = SourcePolicy.from_settings(settings)
    assert policy.data_dir == tmp_path and policy.storage_prefixes == ("s3://a/b/", "gs://c/")
