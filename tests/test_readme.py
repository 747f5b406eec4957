"""README.md is one screen for a newcomer (issue 38): what tunebot is, the two commands (install and the demo;
the tests, which `.ci/run` runs exactly), the daily commands, and one link to each document holding the rest.
On 9a0c9c1 it was 456 lines."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SCREEN = 60  # lines


def _blocks() -> list[list[str]]:
    return [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", README, re.S)]


def test_the_readme_is_one_screen() -> None:
    assert len(README.splitlines()) <= SCREEN, len(README.splitlines())


def test_its_two_commands_are_the_demo_and_exactly_what_ci_runs() -> None:
    demo, tests = _blocks()[:2]
    assert demo == ["./scripts/install.sh && .venv/bin/tunebot demo"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and line[0] not in "#"]
    assert tests == [ci[-1]] == ["./scripts/test.sh"], (tests, ci[-1])  # .ci/run ends with README's command


def test_each_document_is_linked_once_and_exists() -> None:
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert len(links) == len(set(links)), links
    assert all((ROOT / link).is_file() for link in links), [x for x in links if not (ROOT / x).is_file()]
    for doc in ("using", "cloud", "workspace", "configuration", "estimate-quality", "limits", "testing"):
        assert f"docs/{doc}.md" in links, doc


def test_the_daily_commands_exist_at_the_cli() -> None:
    """Every `tunebot ...` line of the README, as written, is taken by the CLI's parser."""
    from chat.test_suggested_commands import cli_parse

    daily = [line for block in _blocks()[2:] for line in block if line.startswith("tunebot ")]
    assert len(daily) >= 6, daily
    for line in daily:
        words = []
        for word in shlex.split(line.split("#")[0])[1:]:  # [a|b] written as its first choice, JOB as an id
            word = word.removeprefix("[").removesuffix("]").split("|")[0]
            words.append("0123456789ab" if word in ("JOB", "SWEEP") else word)
        assert cli_parse(words) is None, (line, words, cli_parse(words))
