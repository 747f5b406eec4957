"""Objects the bot leaves in storage for one run only: encrypted to that run's key (AES-GCM).

Whatever lies in storage can be read by whoever holds a credential for its prefix, and on a store that cannot
scope credentials that is every host. What the bot leaves for a run - its renewed storage credentials
(bot/storage/renewal.py) - must be readable by that run alone, so it is sealed: AES-256-GCM under a key
derived from the run's own key (HMAC-SHA256(run key, purpose)), a fresh 96-bit nonce per object, and the job
and run ids as associated data (an object sealed for another run or job does not open). The bot and the
runner both import this module (``cryptography``, no torch).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import Any

VERSION = 2  # 1 was the signed plain object (readable by any holder of a credential for the job's folder)


class SealError(ValueError):
    """The object is not sealed for this run (another run's, another job's, changed, or not an object)."""


def _key(run_key: bytes, purpose: str) -> bytes:
    return hmac.new(run_key, b"tunebot sealed v1\0" + purpose.encode(), hashlib.sha256).digest()


def _aad(purpose: str, job_id: str, run_id: str | None) -> bytes:
    return f"{purpose}\0{job_id}\0{run_id or ''}".encode()


def seal(run_key: bytes, purpose: str, job_id: str, run_id: str | None, payload: dict[str, Any]) -> bytes:
    """``payload`` as the JSON object a runner opens with ``open_sealed``."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    box = AESGCM(_key(run_key, purpose)).encrypt(nonce, body, _aad(purpose, job_id, run_id))
    obj = {
        "version": VERSION,
        "sealed": purpose,
        "nonce": base64.b64encode(nonce).decode(),
        "data": base64.b64encode(box).decode(),
    }
    return json.dumps(obj).encode()


def open_sealed(run_key: bytes, purpose: str, job_id: str, run_id: str | None, raw: bytes) -> dict[str, Any]:
    """The payload of a sealed object; SealError when it was not sealed for this run, job and purpose."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict) or obj.get("version") != VERSION or obj.get("sealed") != purpose:
            raise SealError("not a sealed object of this kind")
        nonce = base64.b64decode(obj["nonce"], validate=True)
        box = base64.b64decode(obj["data"], validate=True)
        body = AESGCM(_key(run_key, purpose)).decrypt(nonce, box, _aad(purpose, job_id, run_id))
        payload = json.loads(body)
    except SealError:
        raise
    except (InvalidTag, ValueError, KeyError, TypeError) as exc:
        raise SealError(f"not sealed for this run ({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        raise SealError("the sealed payload is not an object")
    return payload
