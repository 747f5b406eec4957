"""`tunebot estimate`, `tunebot launch` and `/tune estimate|launch` accept the same keys and value formats.

Table-driven over every option of bot/planner/options.py: the option's example value (written the way people
write it: `20M`, `4k`, `$25`, `QLoRA`, `Q,V`, `5%`) goes in through each surface - the chat grammar, the
CLI flag (`--key VALUE`, or `--key/--no-key` for yes/no options) and the CLI `key=value` word - and every
surface must hand the engine the same EstimateRequest. Issue 10: the CLI refused `--tokens 2M`,
`--max-cost '$25'` and `--method QLoRA` that chat accepted, chat refused `seq=4k`, and `tunebot launch`
lacked options the chat grammar had.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from typer.testing import CliRunner

from bot.chat.grammar import KEYS_HELP, EstimateCmd, LaunchCmd, parse
from bot.cli import app
from bot.planner.options import OPTIONS, Option
from bot.planner.request import EstimateRequest

MODEL = "llama-3.1-8b"
DATASET = "s3://bucket/train.jsonl"  # a URI: the CLI does not look for it on disk


def expected(option: Option) -> Any:
    return option.parse(option.example)


def cli_flag_args(option: Option) -> list[str]:
    name = option.key.replace("_", "-")
    if option.flag:
        return [f"--{name}" if expected(option) else f"--no-{name}"]
    return [f"--{name}", option.example]


class Captured(Exception):
    pass


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch) -> dict[str, EstimateRequest]:
    """Run the CLI up to the planner's inputs / the engine and keep the request it built."""
    seen: dict[str, EstimateRequest] = {}

    def planner(request: EstimateRequest, **_: Any) -> Any:
        seen["estimate"] = request
        raise Captured

    class Engine:
        def create_job(self, request: EstimateRequest, **_: Any) -> Any:
            seen["launch"] = request
            raise Captured

        def close(self) -> None:
            return None

    import bot.commands.engine_commands as engine_commands
    import bot.planner
    import bot.planner.inputs

    monkeypatch.setattr(bot.planner, "estimate", planner)
    # The first use of the request: the model and dataset are read before any estimate (no storage here).
    monkeypatch.setattr(bot.planner.inputs, "resolve_inputs", planner)
    monkeypatch.setattr(engine_commands, "_engine", lambda: Engine())
    return seen


def as_asked(request: EstimateRequest) -> EstimateRequest:
    """The request as the person's words made it: how the bot's runners log to W&B is the bot's setting, set
    where every door prices the request (offers.with_wandb), not an option."""
    return request.model_copy(update={"wandb": "disabled"})


def run_cli(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, Captured), (args, result.output)


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_every_option_means_the_same_on_every_surface(
    option: Option, capture: dict[str, EstimateRequest]
) -> None:
    value = expected(option)
    needs_dataset = option.field not in ("dataset", "tokens")
    base = [f"dataset={DATASET}"] if needs_dataset else []
    chat_estimate = parse(f"estimate {MODEL} {option.key}={option.example} {' '.join(base)}")
    chat_launch = parse(f"launch {MODEL} {option.key}={option.example} {' '.join(base)}")
    assert isinstance(chat_estimate, EstimateCmd) and isinstance(chat_launch, LaunchCmd)
    want = chat_estimate.request
    assert getattr(want, option.field) == value and chat_launch.request == want

    dataset_flag = ["--dataset", DATASET] if needs_dataset else []
    for words in (cli_flag_args(option), [f"{option.key}={option.example}"]):
        run_cli(["estimate", MODEL, *words, *dataset_flag])
        assert as_asked(capture.pop("estimate")) == want, words
        launch_dataset = dataset_flag if option.field != "tokens" else ["--dataset", DATASET]
        run_cli(["launch", MODEL, *words, *launch_dataset])
        launched = capture.pop("launch")
        assert getattr(launched, option.field) == value, words
        if option.field != "tokens":
            assert as_asked(launched) == want, words


@pytest.mark.parametrize(
    ("chat", "cli", "field", "value"),
    [
        ("tokens=2M", ["--tokens", "2M"], "tokens", 2_000_000),
        ("max_cost=$25", ["--max-cost", "$25"], "max_cost", 25.0),
        ("method=QLoRA", ["--method", "QLoRA"], "method", "qlora"),
        ("seq=4k", ["--seq-len", "4k"], "seq_len", 4096),
        ("targets=Q,V", ["--lora-targets", "q,v"], "lora_targets", ["q", "v"]),
        ("lora_r=32", ["--lora-r", "32"], "lora_r", 32),
        ("checkpointing=no", ["--no-gradient-checkpointing"], "gradient_checkpointing", False),
        ("interruptible=on-demand", ["--on-demand"], "interruptible", False),
        ("eval=5%", ["--eval-split", "0.05"], "eval_split", 0.05),
        ("lr=1e-4", ["--learning-rate", "0.0001"], "learning_rate", 1e-4),
    ],
)
def test_the_formats_people_type_in_both_places(
    chat: str, cli: list[str], field: str, value: Any, capture: dict[str, EstimateRequest]
) -> None:
    assert getattr(parse(f"estimate {MODEL} {chat}").request, field) == value
    run_cli(["estimate", MODEL, *cli])
    assert getattr(capture["estimate"], field) == value


def test_bad_values_are_refused_the_same_way_everywhere(capture: dict[str, EstimateRequest]) -> None:
    for chat, cli in (
        ("seq=banana", ["--seq", "banana"]),
        ("method=full2", ["--method", "full2"]),
        ("batch=0", ["--batch-size", "0"]),
        ("bogus=1", ["bogus=1"]),
    ):
        from bot.chat.grammar import ParseError

        with pytest.raises(ParseError) as info:
            parse(f"estimate {MODEL} {chat}")
        result = CliRunner().invoke(app, ["estimate", MODEL, *cli])
        assert result.exit_code == 2 and "Traceback" not in result.output
        key = chat.split("=")[0]
        assert key in info.value.message and key in result.output, (info.value.message, result.output)


def test_help_lists_every_option_on_both_surfaces() -> None:
    cli_help = CliRunner().invoke(app, ["launch", "--help"], terminal_width=200).output
    for option in OPTIONS:
        assert f"{option.key}=" in KEYS_HELP, option.key
        assert option.cli_flags()[0] in cli_help, option.key


def test_slack_replies_never_quote_command_line_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Suggestions, rejections, help and errors in chat use key=value, which /tune (and the CLI) take."""
    from bot.chat.handlers import Actor, ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.engine.service import Engine
    from bot.settings import Settings

    eng = Engine(
        Settings(TUNEBOT_DATA_DIR=str(tmp_path / "d")), db_url=f"sqlite:///{tmp_path / 'db'}", providers={}
    )
    chat = ChatHandlers(eng, Permissions(admins=frozenset({"U1"})))
    texts = []
    for command in (
        "estimate llama-3.1-70b method=full gpu=rtx-4090 tokens=1M",  # nothing fits: suggestions
        "estimate llama-3.1-8b gpus=1 tokens=1M interruptible=no",  # rejected rows say why
        "estimate llama-3.1-8b tokens=5 dataset=x.jsonl",
        "help",
        "help estimate",
        "estimate llama-3.1-8b seq=4kk",
    ):
        reply = chat.handle_text(command, Actor("U1", "C1"))
        texts.append(repr(reply))
    eng.close()
    flags = {m for text in texts for m in re.findall(r"(?<![\w-])--[a-z][a-z-]+", text)}
    assert flags == set(), flags
    assert any("gpus=" in t or "method=qlora" in t for t in texts[:1])


@pytest.mark.parametrize(
    ("chat", "cli", "hint"),
    [
        ("lerning_rate=1e-4", ["lerning_rate=1e-4"], "did you mean `learning_rate`?"),
        ("max_cots=$5", ["max_cots=$5"], "did you mean `max_cost`?"),
        ("method=lorra", ["--method", "lorra"], "did you mean `lora`?"),
        ("scheduler=cosin", ["scheduler=cosin"], "did you mean `cosine`?"),
    ],
)
def test_a_typo_gets_a_did_you_mean_at_every_door(
    capture: dict[str, EstimateRequest], chat: str, cli: list[str], hint: str
) -> None:
    """Issue 27: a mistyped option or value got no suggestion. The chat grammar (Slack and the console) and
    the CLI (key=value words and flags) read options through bot/planner/options.py: the same hint."""
    from bot.chat.grammar import ParseError

    with pytest.raises(ParseError) as info:
        parse(f"estimate {MODEL} {chat}")
    assert hint in info.value.message, info.value.message
    result = CliRunner().invoke(app, ["estimate", MODEL, *cli])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert hint in " ".join(result.output.split()), result.output


def test_a_mistyped_command_gets_a_did_you_mean() -> None:
    from bot.chat.grammar import ParseError

    with pytest.raises(ParseError) as info:
        parse(f"estmate {MODEL}")
    assert "unknown command `estmate`; did you mean `estimate`?" in info.value.message
    with pytest.raises(ParseError) as far:
        parse("frobnicate")
    assert "did you mean" not in far.value.message  # nothing close: no guess
