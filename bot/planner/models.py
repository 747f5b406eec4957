"""Resolve what a person typed (hub id, short alias, config.json, model folder) to an Architecture.

Order: a local config.json or folder; the built-in table (data/models.json: real config values of
popular models, case-insensitive ids and short aliases; variants such as -Instruct share their base's
config but keep their own id: the model asked for is the model trained); the Hugging Face hub
(config.json fetched with httpx, HF_TOKEN as bearer, cached under the tunebot data folder; base URL from
HF_ENDPOINT for a mirror, TUNEBOT_HF_URL its former name; TUNEBOT_HF_OFFLINE=1, or HF_HUB_OFFLINE=1 without a
named endpoint, disables it).
When the network fails, the table's nearest entry is not guessed: the error lists close names.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from bot.planner.architectures import Architecture, from_config
from bot.planner.errors import PlanningError, UnknownModelError

DATA = Path(__file__).parent / "data" / "models.json"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_SUFFIXES = ("-instruct", "-chat-hf", "-hf", "-chat", "-it", "-base")


@lru_cache(maxsize=1)
def _table() -> tuple[dict[str, tuple[str, dict[str, Any]]], list[str]]:
    """Lookup key -> (the hub id that key names, the entry whose config it uses), and the hub ids for
    suggestions. A hub-id alias (``meta-llama/Llama-3.1-8B-Instruct`` on the Llama-3.1-8B entry) names
    itself: it shares the entry's config, never its id."""
    raw = json.loads(DATA.read_text())
    index: dict[str, tuple[str, dict[str, Any]]] = {}
    names: list[str] = []
    for entry in raw["models"]:
        for key in [entry["id"], *entry["aliases"]]:
            model_id = key if "/" in key else entry["id"]
            if model_id not in names:
                names.append(model_id)
            for variant in (key.lower(), key.lower().split("/")[-1]):
                index.setdefault(variant, (model_id, entry))
    return index, names


def _strip(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def known_models() -> list[str]:
    return list(_table()[1])


class TableHit(NamedTuple):
    model_id: str  # what is trained: the name asked for (a known hub id in its canonical spelling)
    config: dict[str, Any]
    config_of: str  # the table entry whose config it uses (the same model, or a variant of it)


def table_lookup(name: str) -> TableHit | None:
    """The table's config for a name, without ever renaming the model.

    A listed id or alias (any case) is that model. A hub id the table does not list but whose name (without
    its organisation, or without a variant suffix such as -Instruct, -chat, -it) is listed keeps its own id
    and shares that entry's config: ``acme/Llama-3.1-8B-Instruct`` trains ``acme/Llama-3.1-8B-Instruct``. A
    short name matched only by dropping a suffix names no repo (``qwen2.5-7b-chat``): None, so the person is
    asked for the hub id instead of being given the base model."""
    index, _ = _table()
    key = name.strip().lower()
    if key in index:
        model_id, entry = index[key]
        return TableHit(model_id, entry["config"], entry["id"])
    if "/" not in key:
        return None
    last = key.split("/")[-1]
    for variant in (last, _strip(key), _strip(last)):
        if variant in index:
            entry = index[variant][1]
            return TableHit(name.strip(), entry["config"], entry["id"])
    return None


def closest(name: str, n: int = 5) -> list[str]:
    index, names = _table()
    key = name.strip().lower()
    pool = {k: v[0] for k, v in index.items()}
    hits = difflib.get_close_matches(key, list(pool), n=12, cutoff=0.4)
    hits += difflib.get_close_matches(key.split("/")[-1], list(pool), n=12, cutoff=0.4)
    out: list[str] = []
    for hit in hits:
        if pool[hit] not in out:
            out.append(pool[hit])
    return out[:n]


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanningError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise PlanningError(f"{path} is not a config.json object")
    return data


def _cache_dir() -> Path:
    from bot.settings import get_settings

    return get_settings().data_dir / "hub-configs"


def hub_url() -> str:
    """The Hub the bot reads configs and tokenizers from: HF_ENDPOINT (the standard variable, as
    huggingface_hub and the runner read it; a mirror or an enterprise Hub), else TUNEBOT_HF_URL (its former
    name), else https://huggingface.co."""
    named = os.environ.get("HF_ENDPOINT") or os.environ.get("TUNEBOT_HF_URL") or "https://huggingface.co"
    return named.strip().rstrip("/")


def _hub_offline() -> bool:
    """The bot asks no Hub: TUNEBOT_HF_OFFLINE=1 (the bot only; runners unaffected), or HF_HUB_OFFLINE=1 when
    no Hub is named explicitly (HF_ENDPOINT or TUNEBOT_HF_URL: the preflight's rule,
    engine/launching/preflight.py, so that a mirror on this network is still asked)."""
    on = ("1", "true", "yes")
    named = os.environ.get("HF_ENDPOINT") or os.environ.get("TUNEBOT_HF_URL")
    return os.environ.get("TUNEBOT_HF_OFFLINE", "").lower() in on or (
        os.environ.get("HF_HUB_OFFLINE", "").lower() in on and not named
    )


# A real config.json is a few KB (the largest multimodal ones ~100 KB): anything bigger is not one, and is
# neither read whole nor cached.
MAX_CONFIG_BYTES = 2 << 20
FETCH_DEADLINE_S = 15.0  # the whole fetch, however slowly the server trickles bytes
# (keys, smallest, largest) of the dimensions the planner multiplies: a fetched config outside them is no
# model it can price (and a 10^12 hidden size would only make absurd numbers).
DIMENSIONS: tuple[tuple[tuple[str, ...], int, int], ...] = (
    (("hidden_size", "n_embd", "n_embed", "d_model"), 1, 1 << 17),
    (("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"), 1, 4096),
    (("num_attention_heads", "n_head", "num_heads", "num_key_value_heads"), 1, 4096),
    (("head_dim", "d_kv"), 1, 1 << 13),
    (("intermediate_size", "ffn_dim", "d_ff", "moe_intermediate_size"), 1, 1 << 20),
    (("shared_expert_intermediate_size",), 0, 1 << 20),
    (("vocab_size",), 1, 1 << 24),
    (("num_local_experts", "num_experts", "n_routed_experts"), 0, 1 << 16),
    (("num_experts_per_tok", "moe_topk"), 0, 1 << 10),
)


def check_dimensions(cfg: dict[str, Any], name: str) -> None:
    """PlanningError when a config's dimensions are not whole numbers in a model's range."""
    for part in (cfg, cfg.get("text_config")):
        if not isinstance(part, dict):
            continue
        for keys, low, high in DIMENSIONS:
            for key in keys:
                value = part.get(key)
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                    shown = repr(value)[:40]
                    raise PlanningError(
                        f"{name}: config.json has {key}={shown}, outside {low}..{high:,}: not a model the "
                        "planner can price"
                    )


def fetch_hub_config(
    hub_id: str, *, timeout: float = 5.0, max_bytes: int = MAX_CONFIG_BYTES
) -> tuple[dict[str, Any], str] | None:
    """config.json of a hub repo: from the disk cache, else fetched; None when unavailable. The response is
    read in chunks up to ``max_bytes`` (its Content-Length checked first) and cached only when it is a
    config within the bounds; PlanningError for one that is not."""
    cache = _cache_dir() / (hub_id.replace("/", "--") + ".json")
    try:
        if cache.is_file() and cache.stat().st_size <= max_bytes:
            cached = json.loads(cache.read_text())
            if isinstance(cached, dict):
                check_dimensions(cached, hub_id)
                return cached, "hub cache"
    except (OSError, ValueError, RecursionError):
        pass  # unreadable or out of bounds: fetched again
    if _hub_offline():
        return None
    import httpx

    base = hub_url()
    headers = {}
    token = os.environ.get("HF_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    too_big = PlanningError(
        f"{hub_id}: its config.json is larger than {max_bytes >> 20} MiB, which no model config is"
    )
    deadline = time.monotonic() + FETCH_DEADLINE_S
    body = bytearray()
    try:
        with httpx.stream(
            "GET",
            f"{base}/{hub_id}/resolve/main/config.json",
            headers=headers,
            timeout=timeout,
            follow_redirects=True,
        ) as resp:
            if resp.status_code != 200:
                return None
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise too_big
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise too_big
                if time.monotonic() > deadline:
                    return None
    except httpx.HTTPError:
        return None
    try:
        cfg = json.loads(bytes(body))
    except (ValueError, RecursionError):
        return None
    if not isinstance(cfg, dict):
        return None
    check_dimensions(cfg, hub_id)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(cfg))
    except OSError:
        pass
    return cfg, "hub"


def resolve(name: str) -> tuple[Architecture, str]:
    """(architecture, source) for a model name; UnknownModelError with close names otherwise."""
    text = (name or "").strip()
    if not text:
        raise UnknownModelError("no model given", known_models()[:5])
    try:  # a name no file system takes (over-long, NUL) is not a path: look it up as a name
        path = Path(text).expanduser()
        is_path = path.suffix == ".json" or path.is_dir() or path.exists()
    except (OSError, ValueError, RuntimeError):
        path, is_path = Path(), False
    if is_path:
        cfg_path = path / "config.json" if path.is_dir() else path
        if not cfg_path.is_file():
            raise PlanningError(f"{cfg_path} does not exist (give a config.json or a model folder)")
        return from_config(_read_config_file(cfg_path), text), "config file"
    hit = table_lookup(text)
    if hit is not None:
        return from_config(hit.config, hit.model_id), "built-in table"
    if HUB_ID.match(text):
        fetched = fetch_hub_config(text)
        if fetched is not None:
            return from_config(fetched[0], text), fetched[1]
    suggestions = closest(text)
    hint = f" Closest known: {', '.join(suggestions)}." if suggestions else ""
    raise UnknownModelError(
        f"unknown model {text!r}: not in the built-in table, not a config.json or model folder"
        + (", and its config.json could not be fetched from the hub" if HUB_ID.match(text) else "")
        + f".{hint}",
        suggestions,
    )
