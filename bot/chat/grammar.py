"""The one command grammar of Slack's `/tune` and the terminal console: text in, a typed Command out.

Pure: no I/O, no engine. Every mistake raises ``ParseError`` whose message says exactly what was wrong
and carries the usage of the command, so both adapters can show a friendly correction.
"""

from __future__ import annotations

import html
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import ValidationError

from bot.engine.ids import is_job_id, shown
from bot.planner import options
from bot.planner.request import EstimateRequest

COMMAND_USAGE: dict[str, str] = {
    "estimate": "estimate MODEL [key=value ...]",
    "launch": "launch MODEL [key=value ...]",
    "status": "status [JOB]",
    "jobs": "jobs [mine|all]",
    "stop": "stop JOB",
    "resume": "resume JOB [max_cost=$X]",
    "clone": "clone JOB [key=value ...]",
    "compare": "compare JOB JOB [JOB ...] | compare SWEEP",
    "sweep": "sweep MODEL key=v1,v2 [key=v1,v2 ...] [key=value ...] max_cost=$X",
    "approve": "approve JOB",
    "spend": "spend [today|week|month] [@user]",
    "volumes": "volumes",
    "gpus": "gpus [GPU]",
    "budget": "budget [show | set user|team NAME daily=X monthly=Y]",
    "calibrate": "calibrate [show | exclude RUN | include RUN]  (admins)",
    "help": "help [COMMAND]",
}

KEYS_HELP = options.keys_help()

USAGE = "\n".join(["/tune " + u for u in COMMAND_USAGE.values()] + [KEYS_HELP])

# The value parsers are the options table's (bot/planner/options.py), shared with the command line.
parse_tokens = options.parse_count
parse_money = options.parse_money
parse_bool = options.parse_bool
parse_interruptible = options.parse_interruptible
_MENTION = re.compile(r"^<@([A-Z0-9]+)(?:\|[^>]*)?>$")
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


class ParseError(Exception):
    """The text is not a valid command; ``str(error)`` says why, ``usage`` how to write it."""

    def __init__(self, message: str, usage: str = USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage


@dataclass(frozen=True)
class Command:
    """Base of every parsed command; ``name`` is the grammar's word for it."""

    name: ClassVar[str] = ""


@dataclass(frozen=True)
class EstimateCmd(Command):
    name: ClassVar[str] = "estimate"
    request: EstimateRequest


@dataclass(frozen=True)
class LaunchCmd(Command):
    name: ClassVar[str] = "launch"
    request: EstimateRequest


@dataclass(frozen=True)
class LaunchFormCmd(Command):
    """`launch` alone: Slack opens the launch form (chat/launch_form.py); the terminal asks for a MODEL."""

    name: ClassVar[str] = "launch"


@dataclass(frozen=True)
class StatusCmd(Command):
    name: ClassVar[str] = "status"
    job_id: str | None = None


@dataclass(frozen=True)
class JobsCmd(Command):
    name: ClassVar[str] = "jobs"
    scope: Literal["mine", "all"] = "mine"


@dataclass(frozen=True)
class StopCmd(Command):
    name: ClassVar[str] = "stop"
    job_id: str


@dataclass(frozen=True)
class ResumeCmd(Command):
    """Continue a stopped or failed job from its newest checkpoint (a higher cap with max_cost=)."""

    name: ClassVar[str] = "resume"
    job_id: str
    max_cost: float | None = None


@dataclass(frozen=True)
class CloneCmd(Command):
    """Relaunch a job with some options changed: estimated, priced and launched like `launch`."""

    name: ClassVar[str] = "clone"
    job_id: str
    changes: dict[str, Any] = field(default_factory=dict)  # EstimateRequest fields (the options table's)


@dataclass(frozen=True)
class CompareCmd(Command):
    """Runs side by side (or a sweep's runs): settings that differ, eval before/after, cost, time."""

    name: ClassVar[str] = "compare"
    job_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class SweepCmd(Command):
    """The best run for a budget: configurations (the product of the values) by successive halving."""

    name: ClassVar[str] = "sweep"
    request: EstimateRequest  # the shared options (max_cost: the whole sweep's)
    grid: dict[str, list[Any]] = field(default_factory=dict)  # request field -> values tried


@dataclass(frozen=True)
class ApproveCmd(Command):
    name: ClassVar[str] = "approve"
    job_id: str


@dataclass(frozen=True)
class SpendCmd(Command):
    name: ClassVar[str] = "spend"
    period: Literal["today", "week", "month"] = "month"
    user: str | None = None


@dataclass(frozen=True)
class VolumesCmd(Command):
    name: ClassVar[str] = "volumes"


@dataclass(frozen=True)
class GpusCmd(Command):
    name: ClassVar[str] = "gpus"
    gpu: str | None = None


@dataclass(frozen=True)
class BudgetShowCmd(Command):
    name: ClassVar[str] = "budget"


@dataclass(frozen=True)
class BudgetSetCmd(Command):
    name: ClassVar[str] = "budget"
    scope: Literal["user", "team"]
    target: str
    daily: float | None = None
    monthly: float | None = None


@dataclass(frozen=True)
class CalibrateCmd(Command):
    """What moved the estimates (``show``), and taking a run out of them or back in (admins only)."""

    name: ClassVar[str] = "calibrate"
    action: Literal["show", "exclude", "include"] = "show"
    run: str | None = None


@dataclass(frozen=True)
class HelpCmd(Command):
    name: ClassVar[str] = "help"
    topic: str | None = None


def usage_for(name: str) -> str:
    line = "/tune " + COMMAND_USAGE[name]
    return line + ("\n" + KEYS_HELP if name in ("estimate", "launch", "clone", "sweep") else "")


def _split(text: str) -> list[str]:
    cleaned = html.unescape(text.translate(_SMART_QUOTES)).replace("\u00a0", " ")
    try:
        return shlex.split(cleaned)
    except ValueError as exc:  # unbalanced quotes
        raise ParseError(f"could not read the command: {exc}") from None


def _key_values(name: str, tokens: list[str]) -> dict[str, Any]:
    try:
        return options.parse_values(options.key_values(tokens))
    except options.OptionError as exc:
        raise ParseError(str(exc), usage_for(name)) from None
    except ValueError as exc:  # a word without "="
        raise ParseError(str(exc), usage_for(name)) from None


def _friendly_validation(name: str, exc: ValidationError) -> ParseError:
    key, msg = options.validation_problems(exc)[0]
    return ParseError(f"{key}: {msg}", usage_for(name))


def _request(name: str, args: list[str]) -> EstimateRequest:
    if not args or "=" in args[0]:
        raise ParseError(f"`{name}` needs a MODEL first (e.g. Llama-3.1-8B)", usage_for(name))
    model, rest = args[0], args[1:]
    if len(model) > 300:
        raise ParseError("the model name is too long", usage_for(name))
    values = _key_values(name, rest)
    try:
        return EstimateRequest(model=model, **values)
    except ValidationError as exc:
        raise _friendly_validation(name, exc) from None


def _job_arg(name: str, args: list[str], *, required: bool) -> str | None:
    if not args:
        if required:
            raise ParseError(f"`{name}` needs a JOB id (see `jobs`)", usage_for(name))
        return None
    if len(args) > 1:
        raise ParseError(f"`{name}` takes one JOB id, got {len(args)} words", usage_for(name))
    if not is_job_id(args[0]):  # the engine's own shape (bot/engine/ids.py)
        raise ParseError(f"{shown(args[0])} is not a job id", usage_for(name))
    return args[0]


def _resume(args: list[str]) -> ResumeCmd:
    if not args or "=" in args[0]:
        raise ParseError("`resume` needs a JOB id first (see `jobs`)", usage_for("resume"))
    job_id = _job_arg("resume", args[:1], required=True) or ""
    values = _key_values("resume", args[1:])
    if set(values) - {"max_cost"}:
        raise ParseError(
            "`resume` takes only max_cost=$X (to change anything else, `clone` the job)", usage_for("resume")
        )
    return ResumeCmd(job_id=job_id, max_cost=values.get("max_cost"))


def _clone(args: list[str]) -> CloneCmd:
    if not args or "=" in args[0]:
        raise ParseError("`clone` needs a JOB id first (see `jobs`)", usage_for("clone"))
    job_id = _job_arg("clone", args[:1], required=True) or ""
    return CloneCmd(job_id=job_id, changes=_key_values("clone", args[1:]))


def _compare(args: list[str]) -> CompareCmd:
    ids = []
    for word in args:
        if not is_job_id(word):
            raise ParseError(f"{shown(word)} is not a job id", usage_for("compare"))
        ids.append(word)
    ids = list(dict.fromkeys(ids))
    sweep = len(ids) == 1 and ids[0].startswith("sw-")
    if len(ids) < 2 and not sweep:
        raise ParseError("`compare` needs two jobs or more (or one sweep)", usage_for("compare"))
    if len(ids) > 12:
        raise ParseError("`compare` takes at most 12 jobs", usage_for("compare"))
    return CompareCmd(job_ids=tuple(ids))


def _sweep(args: list[str]) -> SweepCmd:
    """`sweep MODEL lr=1e-4,2e-4 r=8,16 ... max_cost=$20`: swept options take comma-separated values."""
    if not args or "=" in args[0]:
        raise ParseError("`sweep` needs a MODEL first (e.g. Llama-3.1-8B)", usage_for("sweep"))
    model, rest = args[0], args[1:]
    if len(model) > 300:
        raise ParseError("the model name is too long", usage_for("sweep"))
    try:
        pairs = options.key_values(rest)
    except ValueError as exc:
        raise ParseError(str(exc), usage_for("sweep")) from None
    grid, single = _sweep_grid(pairs)
    shared = _key_values("sweep", [f"{k}={v}" for k, v in single])
    _check_sweep_grid(grid, shared)
    if "max_cost" not in shared:
        raise ParseError("a sweep needs max_cost=$X: the most the whole sweep may spend", usage_for("sweep"))
    try:
        request = EstimateRequest(model=model, **shared)
        for name, values in grid.items():  # every value is one a request takes
            for value in values:
                EstimateRequest(model=model, **{**shared, name: value})
    except ValidationError as exc:
        raise _friendly_validation("sweep", exc) from None
    return SweepCmd(request=request, grid=grid)


def _sweep_grid(pairs: list[tuple[str, str]]) -> tuple[dict[str, list[Any]], list[tuple[str, str]]]:
    """The swept options (a sweepable option given two values or more: request field -> distinct values)
    and the (key, value) pairs every run shares."""
    grid: dict[str, list[Any]] = {}
    single: list[tuple[str, str]] = []
    for key, raw in pairs:
        option = options.option_named(key)
        if option is None or option.field not in options.SWEEPABLE or "," not in raw:
            single.append((key, raw))
            continue
        if option.field in grid:
            raise ParseError(f"{option.key}: is given twice", usage_for("sweep"))
        values = _swept_values(option, raw)
        if len(values) < 2:
            single.append((key, raw.strip(",")))
            continue
        grid[option.field] = values
    return grid, single


def _swept_values(option: options.Option, raw: str) -> list[Any]:
    """The distinct values of a comma-separated list, each parsed as the option does, in the order given."""
    values: list[Any] = []
    for text in (t for t in raw.split(",") if t.strip()):
        try:
            value = option.parse(text)
        except ValueError as exc:
            raise ParseError(f"{option.key}: {exc}", usage_for("sweep")) from None
        if value not in values:
            values.append(value)
    return values


def _check_sweep_grid(grid: dict[str, list[Any]], shared: dict[str, Any]) -> None:
    """A sweep varies something, nothing both shared and swept, and at most MAX_SWEEP_RUNS configurations."""
    both = set(shared) & set(grid)
    if both:
        raise ParseError(f"{options.BY_FIELD[both.pop()].key}: is given twice", usage_for("sweep"))
    if not grid:
        keys = ", ".join(options.BY_FIELD[f].key for f in options.SWEEPABLE)
        raise ParseError(
            f"a sweep needs an option with several values, e.g. lr=1e-4,2e-4 (it may vary {keys})",
            usage_for("sweep"),
        )
    runs = 1
    for values in grid.values():
        runs *= len(values)
    if runs > options.MAX_SWEEP_RUNS:
        raise ParseError(
            f"{runs} configurations: a sweep runs at most {options.MAX_SWEEP_RUNS} (they train at once): "
            "give fewer values",
            usage_for("sweep"),
        )


def _user_ref(text: str) -> str | None:
    match = _MENTION.match(text)
    if match:
        return match.group(1)
    if text.startswith("@") and len(text) > 1 and re.fullmatch(r"@[\w.\-]{1,80}", text):
        return text[1:]
    return None


def _spend(args: list[str]) -> SpendCmd:
    period: str | None = None
    user: str | None = None
    for arg in args:
        if arg.lower() in ("today", "week", "month"):
            if period:
                raise ParseError("give the period once: today, week or month", usage_for("spend"))
            period = arg.lower()
            continue
        ref = _user_ref(arg)
        if ref is None:
            raise ParseError(
                f"`{arg[:80]}` is neither a period (today|week|month) nor @user", usage_for("spend")
            )
        if user:
            raise ParseError("give at most one @user", usage_for("spend"))
        user = ref
    return SpendCmd(period=(period or "month"), user=user)  # type: ignore[arg-type]


def _budget(args: list[str]) -> Command:
    if not args or args == ["show"]:
        return BudgetShowCmd()
    if args[0].lower() != "set":
        raise ParseError(f"`budget {args[0][:80]}`: expected `show` or `set`", usage_for("budget"))
    if len(args) < 3:
        raise ParseError("`budget set` needs user|team and a NAME", usage_for("budget"))
    scope = args[1].lower()
    if scope not in ("user", "team"):
        raise ParseError(f"`{args[1][:80]}`: the scope is user or team", usage_for("budget"))
    target = _user_ref(args[2]) or args[2]
    if "=" in target:
        raise ParseError("`budget set` needs a NAME before the amounts", usage_for("budget"))
    amounts: dict[str, float] = {}
    for tok in args[3:]:
        key, sep, raw = tok.partition("=")
        key = key.lower()
        if not sep or key not in ("daily", "monthly"):
            raise ParseError(f"`{tok[:80]}`: expected daily=X or monthly=Y", usage_for("budget"))
        try:
            amounts[key] = parse_money(raw)
        except ValueError as exc:
            raise ParseError(f"{key}: {exc}", usage_for("budget")) from None
    if not amounts:
        raise ParseError("give daily=X and/or monthly=Y", usage_for("budget"))
    return BudgetSetCmd(
        scope=scope,
        target=target,
        daily=amounts.get("daily"),
        monthly=amounts.get("monthly"),  # type: ignore[arg-type]
    )


RUN_ID = re.compile(r"^[\w:.\-]{1,64}$")  # a job id, or an import's "import:<hash>"


def _calibrate(args: list[str]) -> CalibrateCmd:
    if not args or args == ["show"]:
        return CalibrateCmd()
    action = args[0].lower()
    if action not in ("exclude", "include") or len(args) != 2 or not RUN_ID.match(args[1]):
        raise ParseError("`calibrate` takes `show`, `exclude RUN` or `include RUN`", usage_for("calibrate"))
    return CalibrateCmd(action=action, run=args[1])  # type: ignore[arg-type]


def _estimate(args: list[str]) -> EstimateCmd:
    return EstimateCmd(request=_request("estimate", args))


def _launch(args: list[str]) -> Command:
    """`launch MODEL ...`, or `launch` alone: the form."""
    return LaunchCmd(request=_request("launch", args)) if args else LaunchFormCmd()


def _status(args: list[str]) -> StatusCmd:
    return StatusCmd(job_id=_job_arg("status", args, required=False))


def _jobs(args: list[str]) -> JobsCmd:
    if len(args) > 1 or (args and args[0].lower() not in ("mine", "all")):
        raise ParseError("`jobs` takes `mine` or `all`", usage_for("jobs"))
    return JobsCmd(scope=(args[0].lower() if args else "mine"))  # type: ignore[arg-type]


def _stop(args: list[str]) -> StopCmd:
    return StopCmd(job_id=_job_arg("stop", args, required=True) or "")


def _approve(args: list[str]) -> ApproveCmd:
    return ApproveCmd(job_id=_job_arg("approve", args, required=True) or "")


def _volumes(args: list[str]) -> VolumesCmd:
    if args:
        raise ParseError("`volumes` takes no arguments", usage_for("volumes"))
    return VolumesCmd()


def _gpus(args: list[str]) -> GpusCmd:
    if len(args) > 1:
        raise ParseError("`gpus` takes at most one GPU name", usage_for("gpus"))
    return GpusCmd(gpu=(args[0].lower() if args else None))


def _help(args: list[str]) -> HelpCmd:
    topic = args[0].lower() if args else None
    return HelpCmd(topic=topic if topic in COMMAND_USAGE else None)


# Each command word (aliases included) and the function that reads its arguments.
_PARSERS: dict[str, Callable[[list[str]], Command]] = {
    "estimate": _estimate,
    "est": _estimate,
    "launch": _launch,
    "status": _status,
    "jobs": _jobs,
    "stop": _stop,
    "cancel": _stop,
    "approve": _approve,
    "resume": _resume,
    "continue": _resume,
    "clone": _clone,
    "compare": _compare,
    "sweep": _sweep,
    "spend": _spend,
    "volumes": _volumes,
    "gpus": _gpus,
    "budget": _budget,
    "calibrate": _calibrate,
    "calibration": _calibrate,
    "help": _help,
    "?": _help,
    "-h": _help,
    "--help": _help,
}


def parse(text: str) -> Command:
    """Parse one command line (with or without the `/tune` prefix)."""
    words = _words(text)
    if not words:
        return HelpCmd()
    name, args = words[0].lower(), words[1:]
    parser = _PARSERS.get(name)
    if parser is None:
        hint = options.did_you_mean(name[:80], COMMAND_USAGE)
        raise ParseError(f"unknown command `{name[:80]}`" + (f";{hint}" if hint else ""))
    return parser(args)


def _words(text: str) -> list[str]:
    """The command's words, without the `/tune` prefix: only text of a sane length is read."""
    if not isinstance(text, str):
        raise ParseError("the command must be text")
    if len(text) > 4000:
        raise ParseError("the command is too long (4000 characters at most)")
    words = _split(text)
    if words and words[0].lower() in ("/tune", "tune", "tunebot"):
        words = words[1:]
    return words
