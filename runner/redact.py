"""Secrets the runner holds never appear in what it reports: event messages, the summary line.

An exception text may quote a request, a URL or a header; the bot shows a runner's message to people.
Every value of an environment variable that names a key, token, secret, password or credential (the
storage keys, HF_TOKEN, WANDB_API_KEY, the job's integrity key) and the report token are replaced by ***.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
PUBLIC = frozenset({"TUNEBOT_JOB_SPEC", "TUNEBOT_CREDENTIALS_EXPIRE_AT", "TUNEBOT_CREDENTIALS_URI"})


def secret_values(environ: Mapping[str, str] | None = None, extra: Iterable[str | None] = ()) -> list[str]:
    env = os.environ if environ is None else environ
    found = [v for k, v in env.items() if k not in PUBLIC and SECRET_NAME.search(k) and v and len(v) >= 4]
    return sorted({*found, *(e for e in extra if e and len(e) >= 4)}, key=len, reverse=True)


def scrub(text: str | None, secrets: Iterable[str]) -> str | None:
    """``text`` with every secret (raw or JSON-escaped) replaced by ***."""
    if not text:
        return text
    for secret in secrets:
        for form in {secret, json.dumps(secret)[1:-1]}:
            text = text.replace(form, "***")
    return text
