"""What a request may point the bot at: the model and dataset sources a chat user is allowed to name.

The bot reads a request's model (config.json, tokenizer) and dataset (format, token count) on its own
host. The operator at the console or the CLI may name any local path. A chat user (Slack) may not: from
Slack a source is

- a Hub id (``meta-llama/Llama-3.1-8B``, a built-in model name) or an ``hf://`` URI;
- a URI under one of the configured storage prefixes (TUNEBOT_CHAT_STORAGE_PREFIXES, e.g.
  ``s3://team-bucket/datasets/``);
- a file uploaded to Slack (``slack:F0123ABCD`` or the file's link), fetched through Slack's files API;
- a local path inside the allow-listed data folder (TUNEBOT_CHAT_DATA_DIR), resolved with realpath so a
  symlink or ``..`` leading out of it is refused.

Every value, from anyone, is first checked for what no file system or URI takes (NUL, control
characters, over-long names), so a bad name is a clear message instead of an OSError. Refusals never
quote a file's content. ``check_source`` is pure apart from resolving paths (``realpath``/``exists``
arguments, replaceable in tests).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from bot.planner.errors import BadRequestError

Kind = Literal["name", "hub", "uri", "slack_file", "local"]
MAX_SOURCE_CHARS = 1024
MAX_COMPONENT_BYTES = 255  # NAME_MAX of every common file system
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[\w.\-]{1,96}$")
SLACK_FILE_ID = re.compile(r"^F[A-Z0-9]{6,20}$")
# A Slack file's link: https://<workspace>.slack.com/files/<user>/<file id>/<name> or the private
# download URL https://files.slack.com/files-pri/<team>-<file id>/<name>.
_SLACK_LINK = re.compile(
    r"^https://(?:[\w-]+\.)?slack\.com/(?:files/\w+/(?P<a>F[A-Z0-9]{6,20})"
    r"|files-pri/T[A-Z0-9]+-(?P<b>F[A-Z0-9]{6,20}))(?:/[^\s]*)?$"
)
LOCAL_SCHEMES = ("file", "local")


class SourceError(BadRequestError):
    """A model or dataset this requester may not use, or one no file system could name."""


@dataclass(frozen=True)
class SourcePolicy:
    """Where chat users may point the bot (the operator is not limited)."""

    data_dir: Path | None = None  # local paths from chat only inside it (None: none at all)
    storage_prefixes: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: object) -> SourcePolicy:
        raw = str(getattr(settings, "chat_storage_prefixes", "") or "")
        prefixes = tuple(_prefix(p) for p in re.split(r"[,\s]+", raw) if p.strip())
        data_dir = getattr(settings, "chat_data_dir", None)
        return cls(data_dir=Path(data_dir).expanduser() if data_dir else None, storage_prefixes=prefixes)


def _prefix(text: str) -> str:
    text = text.strip()
    text = text if text.endswith("/") else text + "/"
    try:
        return canonical_uri(text, "TUNEBOT_CHAT_STORAGE_PREFIXES")
    except SourceError:
        return text  # compared as written; a URI with tricks is refused before any comparison


# Escapes that read as a path separator, a dot, an escape or NUL once a server or client decodes them:
# `%2e%2e` passes a textual `..` check and then climbs out of the prefix (yarl, nginx, S3 gateways decode).
_TRICKY_ESCAPE = re.compile(r"%(?:2e|2f|5c|25|00)", re.IGNORECASE)
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def canonical_uri(value: str, what: str) -> str:
    """The URI as a store reads it (scheme and host lower-cased, default port dropped, the path's other
    escapes decoded), for comparing with a prefix; SourceError for anything that could read differently to
    this check and to the store: encoded dots, slashes, backslashes or `%`, backslashes, `.`/`..` or empty
    path segments, user info, escapes that are not UTF-8."""
    if "\\" in value:
        raise SourceError(f"{what}: backslashes are not allowed in a URI")
    if _TRICKY_ESCAPE.search(value):
        raise SourceError(f"{what}: percent-encoded `.`, `/`, `\\` or `%` are not allowed in a URI")
    parts = urlsplit(value)
    if "@" in parts.netloc:
        raise SourceError(f"{what}: user names or passwords are not allowed in a URI")
    try:
        path = unquote(parts.path, errors="strict")
    except UnicodeDecodeError:
        raise SourceError(f"{what}: the URI has escapes that are not UTF-8 text") from None
    segments = path.split("/")[1:]
    if any(seg in (".", "..") for seg in segments) or "" in segments[:-1]:
        raise SourceError(f"{what}: `.`, `..` or empty (`//`) path segments are not allowed in a URI")
    scheme_ = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:
        raise SourceError(f"{what}: the URI's port is not a number from 0 to 65535") from None
    if port is not None and str(port) != _DEFAULT_PORTS.get(scheme_):
        host += f":{port}"
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme_}://{host}{path}{query}"


def check_text(value: str, what: str) -> None:
    """Refuse what no path or URI can hold: NUL, control characters, over-long names, unpaired surrogates."""
    if not value.strip():
        raise SourceError(f"{what}: empty")
    if len(value) > MAX_SOURCE_CHARS:
        raise SourceError(f"{what}: too long ({len(value)} characters; {MAX_SOURCE_CHARS} at most)")
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        raise SourceError(f"{what}: contains control characters or bytes that are not text")
    for part in re.split(r"[/\\]", value):
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            raise SourceError(
                f"{what}: a name in it is longer than file systems allow ({MAX_COMPONENT_BYTES} bytes)"
            )


def slack_file_id(value: str) -> str | None:
    """The Slack file id of ``slack:F...`` or a Slack file link (``<...|label>`` as Slack sends it)."""
    text = value.strip()
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1].split("|", 1)[0]
    if text.lower().startswith("slack:"):
        fid = text[6:]
        return fid if SLACK_FILE_ID.match(fid) else None
    m = _SLACK_LINK.match(text)
    return (m.group("a") or m.group("b")) if m else None


def scheme(value: str) -> str:
    head, sep, _ = value.partition("://")
    return head.lower() if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", head) else ""


def classify(
    value: str, role: Literal["model", "dataset", "prompts"], *, is_name: Callable[[str], bool]
) -> Kind:
    """What kind of source a value is (without touching the disk)."""
    if slack_file_id(value):
        return "slack_file"
    sch = scheme(value)
    if sch in LOCAL_SCHEMES:
        return "local"
    if sch == "hf":
        return "hub"
    if sch:
        return "uri"
    if value.startswith(("/", "~", "./", "../", "\\")) or value in (".", ".."):
        return "local"
    if role == "model" and not value.endswith(".json"):
        if is_name(value) or ("/" not in value and "\\" not in value):
            return "name"  # a built-in model, or an unknown name the planner answers with close ones
        if HUB_ID.match(value):
            return "hub"
    return "local"  # a relative path (from chat: relative to the data folder; `./x` for a model folder)


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def check_source(
    value: str,
    role: Literal["model", "dataset", "prompts"],
    policy: SourcePolicy | None,
    *,
    is_name: Callable[[str], bool] = lambda _: False,
    realpath: Callable[[str], str] = os.path.realpath,
    exists: Callable[[str], bool] = os.path.lexists,
) -> tuple[Kind, str]:
    """(kind, the value to use) for a model or dataset; SourceError when not allowed.

    ``policy`` None is the operator (console, CLI): local paths anywhere. A chat policy allows local
    paths only inside its data folder and returns them resolved (absolute, links followed), so what the
    planner and the launch read is the checked file itself.
    """
    what = role
    check_text(value, what)
    kind = classify(value, role, is_name=is_name)
    if policy is None or kind == "slack_file":
        return kind, value
    if kind in ("name", "hub"):
        if scheme(value) == "hf":
            if ".." in value.split("/"):
                raise SourceError(f"{what}: `..` is not allowed in a URI")
            canonical_uri(value, what)  # no encoded dots or slashes either
        if scheme(value) != "hf" and _exists_quietly(exists, value):
            # the planner would read this relative path from the bot's working folder
            raise SourceError(
                f"{what}: `{value}` is also a path on the bot's host; from chat, name files inside the data "
                "folder or upload them to Slack"
            )
        return kind, value
    if kind == "uri":
        if ".." in value.split("://", 1)[1].split("/"):
            raise SourceError(f"{what}: `..` is not allowed in a URI")
        canonical = canonical_uri(value, what)
        if any(canonical.startswith(p) for p in policy.storage_prefixes):
            return kind, value
        allowed = ", ".join(policy.storage_prefixes) or "none are configured (TUNEBOT_CHAT_STORAGE_PREFIXES)"
        raise SourceError(
            f"{what}: from chat, URIs must be under the allowed storage prefixes ({allowed}); or upload the "
            "file to Slack and give `slack:FILE_ID`"
        )
    # local
    if policy.data_dir is None:
        raise SourceError(
            f"{what}: local paths on the bot's host are not allowed from chat (no data folder is set: "
            "TUNEBOT_CHAT_DATA_DIR); upload the file to Slack (`slack:FILE_ID`), use a Hub id or an "
            "allowed storage URI"
        )
    text = value
    for prefix in ("file://", "local://"):
        if text.lower().startswith(prefix):
            text = text[len(prefix) :]
    root = realpath(str(policy.data_dir))
    try:
        resolved = realpath(text if text.startswith("/") else os.path.join(root, text))
    except (OSError, ValueError):
        raise SourceError(f"{what}: not a usable path") from None
    if text.startswith("~") or not _within(resolved, root):
        raise SourceError(
            f"{what}: from chat, local files must be inside the data folder (TUNEBOT_CHAT_DATA_DIR); links "
            "out of it are not followed"
        )
    return kind, resolved


def _exists_quietly(exists: Callable[[str], bool], value: str) -> bool:
    try:
        return bool(exists(value))
    except (OSError, ValueError):
        return False
