"""The request options (bot/planner/options.py) as command-line parameters, for `estimate` and `launch`.

Every option is a flag named after its key and aliases (``--tokens 20M``, ``--seq-len 4k``,
``--method QLoRA``, ``--max-cost '$25'``); yes/no options are ``--packing/--no-packing``; and any option can
also be written as in Slack, ``key=value`` after the model (``tunebot estimate llama-3.1-8b tokens=20M``).
Values go through the same parsers as the chat grammar, so both surfaces accept the same formats.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer

from bot.commands.errors import fail
from bot.planner.options import OPTIONS, Option

_PREFIX = "opt_"  # request options' parameter names (never clash with a command's own parameters)


def _parameter(option: Option) -> inspect.Parameter:
    flags = option.cli_flags()
    if option.flag:
        decls = [f"{f}/--no-{f[2:]}" for f in flags]
        default: Any = typer.Option(None, *decls, help=option.help, show_default=False)
        annotation: Any = bool | None
    else:
        default = typer.Option(
            None, *flags, help=f"{option.help} (e.g. {option.example})", metavar="VALUE", show_default=False
        )
        annotation = str | None
    return inspect.Parameter(
        _PREFIX + option.field, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


MODEL_HELP = "Hub id, short name (llama-3.1-8b), config.json or model folder."


def request_command(
    body: Callable[..., None],
    extra: list[inspect.Parameter],
    doc: str,
    *,
    first: tuple[str, str] = ("model", MODEL_HELP),
) -> Callable[..., None]:
    """A typer command: MODEL (or ``first``: name, help), then key=value words, the option flags, and the
    command's own ``extra``.

    ``body(model, pairs, **extra)`` gets the options as (key, text) pairs in the order given.
    """
    params = [
        inspect.Parameter(
            first[0],
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=str,
            default=typer.Argument(..., help=first[1]),
        ),
        inspect.Parameter(
            "words",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=list[str] | None,
            default=typer.Argument(
                None, metavar="[KEY=VALUE]...", help="Options written as in /tune: tokens=20M seq=4k ..."
            ),
        ),
        *(_parameter(o) for o in OPTIONS),
        inspect.Parameter(
            "on_demand",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(False, "--on-demand", help="Only on-demand offers (= --interruptible no)."),
        ),
        *extra,
    ]

    def command(**kwargs: Any) -> None:
        pairs: list[tuple[str, str]] = []
        for option in OPTIONS:
            value = kwargs.pop(_PREFIX + option.field, None)
            if value is None:
                continue
            pairs.append((option.key, ("yes" if value else "no") if isinstance(value, bool) else value))
        if kwargs.pop("on_demand", False):
            pairs.append(("interruptible", "no"))
        words = kwargs.pop("words", None) or []
        for word in words:
            if "=" not in word:
                fail(f"`{word}` is not a key=value option (options: --help)")
            key, _, raw = word.partition("=")
            pairs.append((key, raw))
        body(kwargs.pop(first[0]), pairs, **kwargs)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = doc
    return command


def parse_pairs(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """The options as EstimateRequest fields; a clear message and exit code 2 on bad input."""
    from bot.planner import options

    try:
        values = options.parse_values(pairs)
    except options.OptionError as exc:
        fail(_cli_message(exc.key, exc.message))
    if values.get("dataset") is not None:
        from bot.planner.sources import SourceError, check_source

        try:  # the operator may name any path, but not one no file system takes (NUL, over-long names)
            check_source(values["dataset"], "dataset", None)
        except SourceError as exc:
            fail(str(exc))
    return values


def build_request(model: str, pairs: list[tuple[str, str]]) -> Any:
    """The EstimateRequest for these options; a clear message and exit code 2 on bad input."""
    from pydantic import ValidationError

    from bot.planner import options
    from bot.planner.request import EstimateRequest

    values = parse_pairs(pairs)
    from bot.planner.sources import SourceError, check_source

    try:
        check_source(model, "model", None)
    except SourceError as exc:
        fail(str(exc))
    try:
        return EstimateRequest(model=model, **values)
    except ValidationError as exc:
        fail("; ".join(_cli_message(key, msg) for key, msg in options.validation_problems(exc)))


def _cli_message(key: str, message: str) -> str:
    from bot.planner.options import option_named

    option = option_named(key)
    flags = ", ".join(option.cli_flags()) if option else f"--{key}"
    return f"{key} ({flags}): {message}"


def parse_chat(words: list[str]) -> Any:
    """``words`` (a command and its arguments, as typed after `tunebot`) read by the chat's own grammar
    (bot/chat/grammar.py): every `key=value` form /tune and the console take, the CLI takes too (resume JOB
    max_cost=$X, stop SWEEP, ...). A clear message with the usage and exit code 2 on bad input."""
    import shlex

    from bot.chat.grammar import ParseError, parse

    try:
        return parse(" ".join(shlex.quote(w) for w in words))
    except ParseError as exc:
        fail(f"{exc.message}\nusage: {exc.usage.replace('/tune ', 'tunebot ')}")
