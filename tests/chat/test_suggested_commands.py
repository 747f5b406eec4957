"""Every command a reply suggests exists at the door it was given (issue 38, item 3).

The CLI prints the same replies as the console and Slack (bot/chat/cards.py, handlers.py, the engine's
messages), so a command a reply suggests in the chat's words ("`status sw-...` shows them", "`resume JOB
max_cost=$0.0072`") is typed at the console, in Slack and after `tunebot`. On 9a0c9c1 the sweep's own message
sent people to a `tunebot status` that did not exist, and `tunebot resume JOB max_cost=$0.0072` was refused
("unexpected extra argument").

The texts are read from the code: every string of bot/ that is not a docstring (f-strings with their values as
placeholders), every `backticked` command in it and every "tunebot WORD". Each is written out with sample
values (a job id, a sweep id, an amount, ...) and checked at each door: the chat's grammar (Slack and the
console) and the CLI's parser; a suggestion that names a job or a sweep is run on the CLI against an empty
database, where it must get as far as looking the job or sweep up.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bot.chat.grammar import COMMAND_USAGE, ParseError, parse
from bot.cli import app

BOT = Path(__file__).resolve().parents[2] / "bot"
JOB, SWEEP, AMOUNT = "0123456789ab", "sw-0123456789ab", "$0.0072"
SAMPLES = {  # the placeholders replies write, as a person would fill them in
    "JOB": JOB,
    "JOB...": JOB[::-1],
    "SWEEP": SWEEP,
    "MODEL": "llama-3.1-8b",
    "RUN": "r1",
    "ID": "v1",
    "PROVIDER": "vast",
    "P": "vast",
    "NAME": "bob",
    "FILE": "runs.csv",
    "GPU": "h100",
    "key=value": "lr=1e-4",
}
CONSOLE_ONLY = {"help": "the CLI's is --help"}  # chat words the CLI does not take, and why


def _placeholder(expression: str, before: str) -> str:
    """A sample value for an f-string's ``{expression}``, from what it is and the text before it."""
    if re.search(r"sweep|\bsid\b", expression):
        return SWEEP
    if before.endswith("=") or re.search(r"money|cost|amount", expression):
        return AMOUNT
    return JOB


def _texts(path: Path) -> list[tuple[str, int]]:
    """Every string of the module that is not a docstring: (text, line), an f-string's values as samples."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    out = []
    for node in ast.walk(tree):
        if id(node) in docs or id(node) in inner:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.value, node.lineno))
        elif isinstance(node, ast.JoinedStr):
            text = ""
            for value in node.values:
                if isinstance(value, ast.Constant):
                    text += str(value.value)
                else:
                    text += _placeholder(ast.unparse(value), text)
            out.append((text, node.lineno))
    return out


def _words(suggestion: str) -> list[str]:
    """The suggestion as typed: [groups] with a value kept, others dropped; `a|b` as `a`; `...` out."""
    text = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1) if "=" in m.group(1) else "", suggestion)
    text = re.sub(r"\{\w*\}", JOB, text)  # a str.format template's {job_id}
    words = []
    for word in text.split():
        word = SAMPLES.get(word, word)
        if word.endswith("..."):
            continue
        word = word.split("|")[0] if "|" in word and not word.startswith("|") else word
        word = re.sub(r"=\$?[XY]$", "=5", word)
        words.append(word)
    return words


def suggestions() -> list[tuple[str, str, list[str]]]:
    """(where, the suggestion as written, its words with samples) for every command a reply suggests."""
    names = set(COMMAND_USAGE) | {"tunebot"}
    found: dict[str, tuple[str, str, list[str]]] = {}
    for path in sorted(BOT.rglob("*.py")):
        for text, line in _texts(path):
            where = f"{path.relative_to(BOT.parent)}:{line}"
            for quoted in re.findall(r"`([^`\n]+)`", text):
                first = quoted.split()[0] if quoted.split() else ""
                if first in names and " | " not in quoted:  # "a | b | c": a usage line, not a suggestion
                    found.setdefault(quoted, (where, quoted, _words(quoted)))
            for word in re.findall(r"\btunebot ([a-z]+)\b", text):  # unquoted: a chat command's name
                if word in COMMAND_USAGE:
                    found.setdefault(f"tunebot {word}", (where, f"tunebot {word}", ["tunebot", word]))
    return sorted(found.values(), key=lambda s: s[1])


def cli_parse(words: list[str]) -> str | None:
    """None when the CLI's parser takes ``words`` (after `tunebot`), "incomplete" when only an argument is
    missing (the suggestion names the command), else the parser's refusal. (Typer carries its own click: its
    classes are told by what they do and their names.)"""
    command = typer.main.get_command(app)
    args = list(words)
    while hasattr(command, "list_commands"):  # a group: `tunebot`, `tunebot budget`, ...
        if not args:
            return None
        sub = command.get_command(command.make_context("tunebot", [], resilient_parsing=True), args[0])
        if sub is None:
            return f"no command `{args[0]}`"
        command, args = sub, args[1:]
    try:
        command.make_context(words[0], args)
    except Exception as exc:  # noqa: BLE001 - the parser's usage errors, whatever click carries them
        if type(exc).__name__ == "MissingParameter":
            return "incomplete"
        if type(exc).__name__ in ("UsageError", "BadParameter", "NoSuchOption", "BadOptionUsage"):
            return exc.format_message()  # type: ignore[attr-defined]
        raise
    return None


def chat_parses(words: list[str]) -> bool:
    try:
        parse(" ".join(words))
    except ParseError:
        return False
    return True


SUGGESTED = suggestions()


def test_the_replies_suggest_the_commands_this_checks() -> None:
    """The scan finds what the issue found: the sweep's `status`, the resume hint with its amount, more."""
    said = {s[1] for s in SUGGESTED}
    assert f"status {SWEEP}" in {" ".join(s[2]) for s in SUGGESTED}, sorted(said)
    assert any(w[:1] == ["resume"] and w[2:] == [f"max_cost={AMOUNT}"] for _, _, w in SUGGESTED)
    assert len(SUGGESTED) > 30 and any(s.startswith("tunebot ") for s in said)


@pytest.mark.parametrize(("where", "suggestion", "words"), SUGGESTED, ids=[s[1] for s in SUGGESTED])
def test_each_suggested_command_exists_at_every_door(where: str, suggestion: str, words: list[str]) -> None:
    cli_words = words[1:] if words[0] == "tunebot" else words
    if words[0] == "tunebot":  # a CLI command: the CLI takes it (or names it, when only a value is missing)
        problem = cli_parse(cli_words)
        assert problem in (None, "incomplete"), f"{where}: `{suggestion}` at the CLI: {problem}"
        return
    # the chat's words: the grammar knows the command, and the CLI takes the same words
    assert words[0] in COMMAND_USAGE, f"{where}: `{suggestion}` is no chat command"
    if words[0] in CONSOLE_ONLY:
        return
    if not chat_parses(words) or len(words) == 1:  # a command named, not a whole line: it exists at the CLI
        problem = cli_parse(cli_words[:1])
        assert problem is None or problem == "incomplete", f"{where}: `{suggestion}` at the CLI: {problem}"
        return
    problem = cli_parse(cli_words)
    assert problem is None, f"{where}: `{suggestion}` is taken in the chat; at the CLI: {problem}"
    if JOB in words or SWEEP in words:  # run it: it gets as far as the lookup of what it names
        out = CliRunner().invoke(app, cli_words)
        named = SWEEP if SWEEP in words else JOB
        kind = "sweep" if named == SWEEP else "(job|calibration run)"
        assert re.search(rf"\bno {kind} {re.escape(named)}", out.output), (
            f"{where}: `tunebot {' '.join(cli_words)}`: {out.output[-800:]}"
        )


# The engine's messages go to a job's Slack thread as well as to the CLI and serve's log: they suggest a
# command in the chat's words (`resume JOB`, which every door takes), never as `tunebot resume JOB`, which a
# Slack member cannot type. Only the operator's own commands on the bot's machine are said as CLI commands,
# and the message that only the CLI prints when no supervisor runs.
OPERATOR_ONLY = {"approve", "budget"}
CLI_ONLY_TEXTS = {"bot/engine/watching/watch.py"}


def test_the_engines_messages_suggest_commands_a_slack_member_can_type() -> None:
    wrong = [
        f"{where}: `{suggestion}`"
        for where, suggestion, words in SUGGESTED
        if where.startswith("bot/engine/")
        and where.split(":")[0] not in CLI_ONLY_TEXTS
        and words[0] == "tunebot"
        and len(words) > 1
        and words[1] not in OPERATOR_ONLY
    ]
    assert not wrong, wrong
