"""The /tune grammar: typed commands out, precise corrections with usage for every mistake."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.chat.grammar import (
    BudgetSetCmd,
    BudgetShowCmd,
    EstimateCmd,
    GpusCmd,
    HelpCmd,
    JobsCmd,
    LaunchCmd,
    ParseError,
    SpendCmd,
    StatusCmd,
    StopCmd,
    VolumesCmd,
    parse,
    parse_tokens,
)


def test_estimate_maps_every_key_to_the_request() -> None:
    cmd = parse(
        "/tune estimate Llama-3.1-8B method=qlora r=32 targets=q_proj,v_proj seq=4096 batch=2 accum=8 "
        "epochs=2 dataset=s3://b/d.jsonl tokens=20M gpus=2 gpu=A100-80GB attn=flash "
        "optimizer=paged_adamw_8bit "
        "checkpointing=no interruptible=spot max_cost=$25.5 packing=off"
    )
    assert isinstance(cmd, EstimateCmd)
    r = cmd.request
    assert (r.model, r.method, r.lora_r, r.lora_targets) == (
        "Llama-3.1-8B",
        "qlora",
        32,
        ["q_proj", "v_proj"],
    )
    assert (r.seq_len, r.batch_size, r.grad_accum, r.epochs) == (4096, 2, 8, 2.0)
    assert (r.dataset, r.tokens, r.gpus, r.gpu, r.attn) == (
        "s3://b/d.jsonl",
        20_000_000,
        2,
        "a100-80gb",
        "flash",
    )
    assert (r.optimizer, r.gradient_checkpointing, r.interruptible, r.max_cost, r.packing) == (
        "paged_adamw_8bit",
        False,
        True,
        25.5,
        False,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("20M", 20_000_000), ("1.5B", 1_500_000_000), ("300k", 300_000), ("2_000", 2000), ("3e6", 3_000_000)],
)
def test_token_suffixes(text: str, expected: int) -> None:
    assert parse_tokens(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("yes", True), ("true", True), ("spot", True), ("no", False), ("false", False), ("on-demand", False)],
)
def test_interruptible_words(value: str, expected: bool) -> None:
    cmd = parse(f"estimate m interruptible={value}")
    assert cmd.request.interruptible is expected


def test_prefix_is_optional_and_commands_parse() -> None:
    assert isinstance(parse("launch Qwen2.5-7B"), LaunchCmd)
    assert parse("status") == StatusCmd(job_id=None)
    assert parse("/tune status j-12") == StatusCmd(job_id="j-12")
    assert parse("jobs all") == JobsCmd(scope="all")
    assert parse("jobs") == JobsCmd(scope="mine")
    assert parse("stop j-1") == StopCmd(job_id="j-1")
    assert parse("spend") == SpendCmd(period="month")
    assert parse("spend <@U123|bob> week") == SpendCmd(period="week", user="U123")
    assert parse("spend today @alice") == SpendCmd(period="today", user="alice")
    assert parse("volumes") == VolumesCmd()
    assert parse("gpus H100-80GB") == GpusCmd(gpu="h100-80gb")
    assert parse("budget") == BudgetShowCmd()
    assert parse("budget show") == BudgetShowCmd()
    assert parse("budget set team ml daily=10 monthly=$200") == BudgetSetCmd(
        scope="team", target="ml", daily=10.0, monthly=200.0
    )
    assert parse("") == HelpCmd()
    assert parse("help launch") == HelpCmd(topic="launch")


def test_smart_quotes_and_html_escapes_from_slack() -> None:
    cmd = parse("estimate m dataset=\u201cmy data.jsonl\u201d")
    assert cmd.request.dataset == "my data.jsonl"


@pytest.mark.parametrize(
    ("text", "needle", "usage"),
    [
        ("estimate", "needs a MODEL", "estimate MODEL"),
        ("estimate m foo=1", "unknown option `foo`", "estimate MODEL"),
        ("estimate m seq", "`seq` is not a key=value", "estimate MODEL"),
        ("estimate m seq=abc", "seq: `abc` is not a sequence length", "estimate MODEL"),
        ("estimate m seq=4", "seq: 4 is too small: at least 8", "estimate MODEL"),
        ("estimate m method=full2", "method: `full2` is not one of full, lora, qlora", "estimate MODEL"),
        ("estimate m tokens=lots", "tokens: `lots` is not a count", "estimate MODEL"),
        ("estimate m interruptible=maybe", "interruptible: `maybe` is not one of", "estimate MODEL"),
        ("estimate m r=8 r=16", "given twice", "estimate MODEL"),
        ("estimate m max_cost=-3", "max_cost", "estimate MODEL"),
        ("stop", "needs a JOB", "stop JOB"),
        ("jobs some", "`jobs` takes `mine` or `all`", "jobs [mine|all]"),
        ("spend yesterday", "`yesterday` is neither a period", "spend [today|week|month]"),
        ("budget set group x daily=1", "scope is user or team", "budget [show"),
        ("budget set user bob", "daily=X and/or monthly=Y", "budget [show"),
        ("frobnicate", "unknown command `frobnicate`", "/tune estimate MODEL"),
        ('estimate "m', "could not read the command", "/tune"),
    ],
)
def test_every_error_says_what_and_shows_usage(text: str, needle: str, usage: str) -> None:
    with pytest.raises(ParseError) as err:
        parse(text)
    assert needle in err.value.message
    assert usage in err.value.usage


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_fuzz_parse_raises_only_parse_error(text: str) -> None:
    try:
        parse(text)
    except ParseError as exc:
        assert exc.message and exc.usage


words = st.sampled_from(
    [
        "estimate",
        "launch",
        "status",
        "jobs",
        "stop",
        "spend",
        "budget",
        "set",
        "team",
        "user",
        "gpus",
        "help",
        "m",
        "seq=",
        "tokens=1.5B",
        "r=0",
        "max_cost=$",
        "interruptible=spot",
        "<@U1|x>",
        "@",
        "=",
        '"',
        "'",
        "epochs=1e999",
        "gpus=1e3",
        "tokens=nan",
        "daily=inf",
        "today",
        "all",
        "volumes",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(words, max_size=8))
def test_fuzz_structured_words(parts: list[str]) -> None:
    try:
        parse(" ".join(parts))
    except ParseError as exc:
        assert exc.message
