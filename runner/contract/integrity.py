"""Authenticated runner output: what only this job's runner (and the bot) can have written.

Storage may be shared (a store that cannot scope credentials per job, a misconfigured bucket policy), so
the bot trusts nothing it reads there on the strength of where it lies. Each run of a job (one launch:
first start, relaunch, resume, growth) has its own secret key (HMAC-SHA256), given to its instance as
``TUNEBOT_JOB_KEY`` (hex) and derived by the bot from its master key, the job id, the run id and a random
secret of that run (bot/engine/launching/integrity.py); it never travels in the spec, a message or a log, and
the bot accepts nothing signed with it once the run has ended or been replaced. With it the runner signs:

- every RunnerEvent it pushes or writes to progress.json (``"mac"`` beside the event's fields);
- every checkpoint's manifest and the output's manifest (runner/contract/manifest.py): file names, sizes
  and SHA-256;
- and it checks (and decrypts: runner/contract/sealed.py) the renewed storage credentials the bot leaves
  for it (bot/storage/renewal.py).

The MAC covers the object's canonical JSON (sorted keys, no spaces, ``mac`` left out) after a purpose tag,
so an event can never pass for a manifest. This module is part of the bot/runner contract: standard
library only (the bot imports it), compared with ``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

KEY_ENV = "TUNEBOT_JOB_KEY"
MAC_FIELD = "mac"
EVENT, MANIFEST, CREDENTIALS, OUTPUT = "event", "manifest", "credentials", "output"


def key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """This job's key from the environment (None when the runner was started without one)."""
    value = (os.environ if environ is None else environ).get(KEY_ENV, "").strip()
    if not value:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return value.encode()


def canonical(obj: Mapping[str, Any]) -> bytes:
    """The bytes a MAC covers: the object without its ``mac``, as sorted compact JSON."""
    body = dict(obj)
    body.pop(MAC_FIELD, None)
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


def mac_of(key: bytes, purpose: str, body: bytes) -> str:
    """The MAC of an object's canonical bytes (``hmac.digest``: HMAC-SHA256 in one call, the same value as
    ``hmac.new(...).hexdigest()``)."""
    return hmac.digest(key, purpose.encode() + b"\0" + body, "sha256").hex()


def mac(key: bytes, purpose: str, obj: Mapping[str, Any]) -> str:
    return mac_of(key, purpose, canonical(obj))


def sign(key: bytes | None, purpose: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with its MAC added (unchanged without a key: a runner started by hand)."""
    out = dict(obj)
    if key:
        out[MAC_FIELD] = mac(key, purpose, obj)
    return out


def verify(key: bytes, purpose: str, obj: Any, body: bytes | None = None) -> bool:
    """True when ``obj`` is a JSON object carrying a MAC made with ``key`` for ``purpose`` (``body``: its
    canonical bytes when the caller has them already)."""
    if not isinstance(obj, Mapping):
        return False
    given = obj.get(MAC_FIELD)
    if not isinstance(given, str) or len(given) != 64:
        return False
    try:
        expected = mac_of(key, purpose, canonical(obj) if body is None else body)
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(expected, given)


def read_signed(
    raw: bytes, key: bytes | None, purpose: str, job_id: str, run_id: str | None, *, max_bytes: int
) -> dict[str, Any] | None:
    """The JSON object the bot left for one run (a sweep's decision, a stop request): within ``max_bytes``,
    naming this job and run, signed with the run's key for ``purpose`` (a runner started by hand, without a
    key, takes it unsigned); None otherwise."""
    if len(raw) > max_bytes:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("job_id") != job_id or obj.get("run_id") != run_id:
        return None
    if key is not None and not verify(key, purpose, obj):
        return None
    return obj
