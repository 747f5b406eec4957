"""The options of a fine-tune request, once: keys, aliases, value formats and help, for every surface.

`tunebot estimate`, `tunebot launch` and `/tune estimate|launch` (Slack and the console) all read their
options from ``OPTIONS`` and parse values with the same functions, so they accept the same keys and the
same formats: ``tokens=20M``, ``seq=4k``, ``max_cost=$25``, ``method=QLoRA``, ``targets=Q,V``. On the
command line a key is also a flag (``--tokens 20M``, ``--seq-len 4k``), and ``key=value`` words work there
too, so anything the bot suggests in either form can be pasted anywhere.

Pure: no I/O. Defaults are not written here: they are the EstimateRequest's (and through it
``runner.contract.spec.Defaults``), so help texts show them from there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# ---- value parsers (each raises ValueError with a message a person can act on) -----------------------

_DECIMAL = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_BINARY = {"k": 2**10, "m": 2**20}  # sequence lengths: 4k = 4096, as people say "a 4k context"
_TRUE = {"yes", "y", "true", "on", "1"}
_FALSE = {"no", "n", "false", "off", "0"}


def _number(text: str, what: str) -> float:
    raw = text.strip().lower().replace("_", "").replace(",", "")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"`{text}` is not {what}") from None
    if not math.isfinite(value):
        raise ValueError(f"`{text}` is not {what}")
    return value


def _with_suffix(text: str, suffixes: dict[str, int], what: str) -> float:
    raw = text.strip().lower().replace("_", "").replace(",", "")
    mult = 1
    if raw and raw[-1] in suffixes:
        mult, raw = suffixes[raw[-1]], raw[:-1]
    return _number(raw, what) * mult if raw else _number(text, what)


def parse_count(text: str) -> int:
    """`20M`, `1.5B`, `2_000_000`, `3e6`, `500k` -> a positive whole count (tokens, steps)."""
    value = _with_suffix(text, _DECIMAL, "a count (try 20M or 1.5B)")
    if value < 1:
        raise ValueError(f"`{text}` is not a positive count")
    return int(round(value))


def parse_length(text: str) -> int:
    """`2048`, `4k` (= 4096), `32K`, `128k` -> tokens in a sequence."""
    value = _with_suffix(text, _BINARY, "a sequence length (try 2048 or 4k)")
    if value < 1 or value != int(value):
        raise ValueError(f"`{text}` is not a whole positive length")
    return int(value)


def parse_int(text: str) -> int:
    value = _number(text, "a whole number")
    if value != int(value):
        raise ValueError(f"`{text}` is not a whole number")
    return int(value)


def parse_float(text: str) -> float:
    return _number(text, "a number")


def parse_fraction(text: str) -> float:
    """`0.05` or `5%` -> 0.05 (eval split, warmup)."""
    raw = text.strip()
    if raw.endswith("%"):
        return _number(raw[:-1], "a percentage") / 100.0
    value = _number(raw, "a fraction (try 0.05 or 5%)")
    if value >= 1:
        raise ValueError(f"`{text}` is not a fraction: give 0.05 or 5%")
    return value


def parse_money(text: str) -> float:
    """`25`, `$25`, `$1,000.50`, `25 USD` -> dollars."""
    raw = text.strip().replace("$", "").replace(",", "")
    raw = re.sub(r"\s*usd$", "", raw, flags=re.IGNORECASE)
    value = _number(raw, "an amount of dollars (try 25 or $25)")
    if value < 0:
        raise ValueError(f"`{text}` is not a positive amount of dollars")
    return value


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"`{text}` is not yes or no")


def parse_interruptible(text: str) -> bool | None:
    low = text.strip().lower()
    if low in ("spot", "interruptible"):
        return True
    if low in ("on-demand", "ondemand", "od", "on_demand"):
        return False
    if low in ("any", "both", "either"):
        return None
    try:
        return parse_bool(low)
    except ValueError:
        raise ValueError(f"`{text}` is not one of yes, no, spot, on-demand, any") from None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """The hint " did you mean `x`?" for the known word closest to a typo ("" when none is close): every
    door's message for a mistyped option, value or command says it the same way."""
    import difflib

    close = difflib.get_close_matches(word.strip().lower(), list(known), n=1, cutoff=0.75)
    return f" did you mean `{close[0]}`?" if close else ""


def choice(*values: str, aliases: dict[str, str] | None = None) -> Callable[[str], str]:
    """A case-insensitive choice among ``values`` (plus aliases), for methods, schedulers, kernels."""
    table = {v.lower(): v for v in values} | {k.lower(): v for k, v in (aliases or {}).items()}

    def parse(text: str) -> str:
        key = text.strip().lower().replace(" ", "_")
        if key in table:
            return table[key]
        dashed = key.replace("_", "-")
        if dashed in table:
            return table[dashed]
        hint = did_you_mean(key, table)
        raise ValueError(f"`{text}` is not one of {', '.join(values)}" + (f";{hint}" if hint else ""))

    parse.choices = values  # type: ignore[attr-defined]
    return parse


def parse_targets(text: str) -> list[str] | str:
    """`all-linear`, or module names / short names separated by commas: `q,v`, `Q_PROJ,V_PROJ`, `attn`."""
    if text.strip().lower() in ("all-linear", "all", "all_linear"):
        return "all-linear"
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not names or not all(re.fullmatch(r"[a-z0-9_.]+", n) for n in names):
        raise ValueError(f"`{text}` is not all-linear or a comma-separated list of module names such as q,v")
    return names


def parse_format(text: str) -> str:
    from runner.contract.records import format_named  # the runner's own names and aliases (pure module)

    if text.strip().lower() == "auto":
        return "auto"
    return format_named(text).value


def parse_gpu(text: str) -> str:
    """`RTX4090`, `rtx_4090`, `RTX 4090`, `4090`, `H100`, `A100 80GB` -> canonical (rtx-4090, ...)."""
    from bot.planner.gpus import gpu  # pure table

    return gpu(parse_text(text)).name


def parse_repo(text: str) -> str:
    repo = text.strip()
    if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", repo) or len(repo) > 200:
        raise ValueError(f"`{text}` is not a Hub repo id (user-or-org/name)")
    return repo


def parse_text(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError("needs a value")
    return value


# ---- the option table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One request option: the key people type (chat `key=value`, CLI `--key value`) and its field."""

    key: str
    field: str  # EstimateRequest field
    parse: Callable[[str], Any]
    help: str
    example: str  # a value in the accepted format (help texts and the table-driven tests)
    aliases: tuple[str, ...] = ()  # other keys accepted for it (chat and CLI)
    flag: bool = False  # yes/no: the CLI also takes a bare --key and --no-key
    group: str = "job"  # "job" (what is trained), "training" (hyperparameters), "offers", "output"

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases)

    def cli_flags(self) -> list[str]:
        return list(dict.fromkeys(f"--{n.replace('_', '-')}" for n in self.names))


METHOD = choice("full", "lora", "qlora")
OPTIONS: tuple[Option, ...] = (
    Option("method", "method", METHOD, "full, lora or qlora", "QLoRA"),
    Option(
        "dataset",
        "dataset",
        parse_text,
        "jsonl path or URI (s3://...)",
        "s3://bucket/train.jsonl",
        aliases=("data",),
    ),
    Option(
        "format",
        "dataset_format",
        parse_format,
        "dataset format: auto, alpaca, messages (chat), prompt_completion (completion), text",
        "chat",
        aliases=("dataset_format",),
    ),
    Option("tokens", "tokens", parse_count, "tokens per epoch instead of a dataset", "20M"),
    Option(
        "epochs", "epochs", parse_float, "passes over the data", "2", aliases=("epoch",), group="training"
    ),
    Option(
        "steps",
        "max_steps",
        parse_count,
        "stop after this many optimizer steps",
        "1k",
        aliases=("max_steps",),
        group="training",
    ),
    Option("r", "lora_r", parse_int, "LoRA rank", "32", aliases=("lora_r", "rank"), group="training"),
    Option(
        "alpha",
        "lora_alpha",
        parse_int,
        "LoRA alpha (default 2 x r)",
        "64",
        aliases=("lora_alpha",),
        group="training",
    ),
    Option(
        "dropout",
        "lora_dropout",
        parse_fraction,
        "LoRA dropout",
        "0.05",
        aliases=("lora_dropout",),
        group="training",
    ),
    Option(
        "targets",
        "lora_targets",
        parse_targets,
        "all-linear or modules: q,v (names of the model's own)",
        "Q,V",
        aliases=("lora_targets", "target_modules"),
        group="training",
    ),
    Option(
        "lr",
        "learning_rate",
        parse_float,
        "learning rate",
        "1e-4",
        aliases=("learning_rate",),
        group="training",
    ),
    Option(
        "scheduler",
        "lr_scheduler",
        choice("cosine", "linear", "constant"),
        "cosine, linear or constant",
        "Linear",
        aliases=("lr_scheduler",),
        group="training",
    ),
    Option(
        "warmup",
        "warmup_ratio",
        parse_fraction,
        "warmup share of the steps",
        "5%",
        aliases=("warmup_ratio",),
        group="training",
    ),
    Option(
        "weight_decay",
        "weight_decay",
        parse_float,
        "AdamW weight decay",
        "0.01",
        aliases=("wd",),
        group="training",
    ),
    Option(
        "eval",
        "eval_split",
        parse_fraction,
        "held-out share of the data (plateau then watches it)",
        "5%",
        aliases=("eval_split", "eval_fraction"),
        group="training",
    ),
    Option(
        "keep",
        "keep",
        choice("best", "last"),
        "the result: best (lowest eval loss; the default with an eval split) or last",
        "last",
        aliases=("result",),
        group="training",
    ),
    Option("seed", "seed", parse_int, "seed of the data order, eval split and init", "7", group="training"),
    Option(
        "precision",
        "precision",
        choice("mixed", "bf16", "fp32"),
        "full fine-tune weights: mixed (fp32 master + bf16 compute), bf16 (pure: half the memory, small "
        "updates lost) or fp32",
        "bf16",
        group="training",
    ),
    Option(
        "plateau",
        "plateau",
        parse_bool,
        "stop when the loss stops improving",
        "no",
        flag=True,
        group="training",
    ),
    Option(
        "patience",
        "plateau_patience",
        parse_int,
        "plateau: looks without improvement before stopping",
        "20",
        aliases=("plateau_patience",),
        group="training",
    ),
    Option("seq", "seq_len", parse_length, "tokens per sequence (4k = 4096)", "4k", aliases=("seq_len",)),
    Option("batch", "batch_size", parse_int, "micro-batch per GPU", "2", aliases=("batch_size",)),
    Option(
        "accum",
        "grad_accum",
        parse_int,
        "gradient accumulation steps",
        "8",
        aliases=("grad_accum", "gradient_accumulation"),
    ),
    Option(
        "checkpointing",
        "gradient_checkpointing",
        parse_bool,
        "activation checkpointing",
        "no",
        flag=True,
        aliases=("gradient_checkpointing",),
    ),
    Option("packing", "packing", parse_bool, "pack short examples into full rows", "no", flag=True),
    Option(
        "attn",
        "attn",
        choice("eager", "sdpa", "flash"),
        "attention kernel: eager, sdpa or flash",
        "SDPA",
        aliases=("attention",),
    ),
    Option(
        "loss",
        "loss",
        choice("chunked", "plain", "liger"),
        "cross-entropy: chunked (default, least memory), plain, or liger (CUDA kernels)",
        "plain",
    ),
    Option(
        "optimizer",
        "optimizer",
        choice(
            "adamw",
            "adamw_8bit",
            "paged_adamw_8bit",
            aliases={"adamw_torch": "adamw", "adamw-8bit": "adamw_8bit"},
        ),
        "adamw, adamw_8bit or paged_adamw_8bit",
        "AdamW_8bit",
        aliases=("optim",),
    ),
    Option(
        "adamw_impl",
        "optimizer_impl",
        choice("fused", "foreach", "for-loop", aliases={"for_loop": "for-loop", "loop": "for-loop"}),
        "how torch's AdamW steps: fused (default, in place), foreach (a state-sized temporary) or for-loop",
        "foreach",
        aliases=("optimizer_impl",),
    ),
    Option("gpus", "gpus", parse_int, "GPUs per offer (FSDP shards across them)", "2", group="offers"),
    Option("gpu", "gpu", parse_gpu, "only this GPU (rtx-4090, a100-80gb, ...)", "A100-80GB", group="offers"),
    Option(
        "interruptible",
        "interruptible",
        parse_interruptible,
        "yes|spot, no|on-demand, or any",
        "spot",
        flag=True,
        aliases=("spot",),
        group="offers",
    ),
    Option(
        "max_cost",
        "max_cost",
        parse_money,
        "spend cap in dollars (offers above it are rejected)",
        "$25",
        aliases=("budget", "maxcost"),
        group="offers",
    ),
    Option(
        "push_to_hub",
        "push_to_hub",
        parse_repo,
        "push the result to this Hub repo (private)",
        "acme/llama-lora",
        aliases=("hub", "push"),
        group="output",
    ),
    Option("public", "hub_public", parse_bool, "make the Hub repo public", "yes", flag=True, group="output"),
    Option(
        "prompts",
        "prompts",
        parse_text,
        "jsonl of prompts both models answer side by side (default: held-out examples)",
        "prompts.jsonl",
        aliases=("prompts_file",),
        group="output",
    ),
    Option(
        "samples",
        "samples",
        parse_int,
        "side-by-side answers: how many prompts (0: none)",
        "3",
        aliases=("n_samples",),
        group="output",
    ),
    Option(
        "merge",
        "merge",
        parse_bool,
        "also save the base model with the adapter merged in",
        "yes",
        flag=True,
        group="output",
    ),
)
BY_NAME: dict[str, Option] = {name: o for o in OPTIONS for name in o.names}
# What `sweep` may vary (`lr=1e-4,2e-4 r=8,16`): options that train differently on the same data and length.
SWEEPABLE = (
    "learning_rate",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "warmup_ratio",
    "weight_decay",
    "lr_scheduler",
    "batch_size",
    "grad_accum",
)
MAX_SWEEP_RUNS = 8  # configurations in one sweep (they run at once)
BY_FIELD: dict[str, Option] = {o.field: o for o in OPTIONS}


class OptionError(ValueError):
    """A bad option; ``key`` is the option's key as written in the table (or as typed when unknown)."""

    def __init__(self, key: str, message: str, *, text: str | None = None) -> None:
        super().__init__(text or f"{key}: {message}")
        self.key = key
        self.message = message


def normalise_key(key: str) -> str:
    return key.strip().lower().lstrip("-").replace("-", "_")


def option_named(key: str) -> Option | None:
    return BY_NAME.get(normalise_key(key))


def parse_values(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """(key, text) pairs -> {EstimateRequest field: value}; OptionError on an unknown, repeated or bad one."""
    values: dict[str, Any] = {}
    for key, raw in pairs:
        option = option_named(key)
        if option is None:
            known = ", ".join(o.key for o in OPTIONS)
            name = normalise_key(key)
            hint = did_you_mean(name, BY_NAME)
            hint = f";{hint}" if hint else ""
            message = f"unknown option{hint} (known: {known})"
            raise OptionError(name, message, text=f"unknown option `{name}`{hint} (known: {known})")
        if raw is None or str(raw).strip() == "":
            raise OptionError(option.key, "needs a value")
        if option.field in values:
            raise OptionError(option.key, "is given twice")
        try:
            values[option.field] = option.parse(str(raw))
        except ValueError as exc:
            raise OptionError(option.key, str(exc)) from None
    return values


def key_values(words: Iterable[str]) -> list[tuple[str, str]]:
    """`key=value` words -> pairs; ValueError naming a word without `=`."""
    pairs = []
    for word in words:
        if "=" not in word:
            raise ValueError(f"`{word}` is not a key=value option")
        key, _, raw = word.partition("=")
        pairs.append((key, raw))
    return pairs


def as_text(value: Any) -> str:
    """A value written the way the options accept it back (suggestions, cards)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def suggest(field: str, value: Any) -> str:
    """``key=value`` for a request field: valid in /tune and on the command line alike."""
    option = BY_FIELD.get(field)
    return f"{option.key if option else field}={as_text(value)}"


def keys_help() -> str:
    """One line per group: every key with an example value."""
    groups: dict[str, list[str]] = {}
    for o in OPTIONS:
        groups.setdefault(o.group, []).append(f"{o.key}={o.example}")
    names = {"job": "job", "training": "training", "offers": "offers", "output": "output"}
    return "\n".join(f"{names[g]} keys: " + " ".join(items) for g, items in groups.items())


def validation_problems(exc: Any) -> list[tuple[str, str]]:
    """(option key, message) for each error of a pydantic ValidationError on an EstimateRequest."""
    out: list[tuple[str, str]] = []
    for err in exc.errors():
        loc = err.get("loc") or ("?",)
        field = str(loc[0])
        option = BY_FIELD.get(field)
        msg = str(err.get("msg", "invalid value"))
        ctx = err.get("ctx") or {}
        if "expected" in ctx:
            msg = f"must be one of {ctx['expected']}"
        elif err.get("type") == "string_pattern_mismatch" and option is not None:
            msg = f"`{err.get('input')}` is not valid ({option.help})"
        elif err.get("type") in _BOUNDS:  # pydantic's "Input should be less than or equal to 10000000000000"
            bound, size, word = _BOUNDS[err["type"]]
            msg = f"{_compact(err.get('input'))} is too {size}: {word} {_compact(ctx.get(bound))}"
        out.append((option.key if option else field, msg))
    return out or [("request", "invalid")]


# pydantic's bound errors: (its context key, too what, the bound in words)
_BOUNDS = {
    "less_than_equal": ("le", "large", "at most"),
    "less_than": ("lt", "large", "below"),
    "greater_than_equal": ("ge", "small", "at least"),
    "greater_than": ("gt", "small", "above"),
}


def _compact(value: Any) -> str:
    """A number as the options are typed: 10T for 10**13 tokens, 999,999T for a typo's 999999T, else as is."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        for suffix, scale in sorted(_DECIMAL.items(), key=lambda kv: -kv[1]):
            if suffix != "g" and value % scale == 0:
                return f"{value // scale:,}{suffix.upper()}"
        return f"{value:,}"
    return as_text(value) if value is not None else "?"
