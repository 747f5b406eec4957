"""What tunebot knows about a cloud besides its client: declared once, in the cloud's own module.

Every cloud module in ``bot/providers/`` ends with ``CLOUD = CloudSpec(...)``; ``CLOUDS`` in
bot/providers/registry.py lists them, and the registry (the cloud variables), the live catalog and the dated
snapshot (bot/providers/snapshot.py) read them from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

COUNTS = (1, 2, 4, 8)  # the offer sizes a snapshot carries unless a GPU says otherwise


@dataclass(frozen=True)
class Snapshot:
    """A cloud's dated offline prices: what estimates use when the cloud has no key or does not answer.

    ``gpus`` maps a canonical GPU name to (on-demand $/GPU-h, interruptible $/GPU-h or None) and,
    optionally, the GPU counts sold (else ``counts``)."""

    date: str  # ISO date the prices were read
    gpus: Mapping[str, tuple[Any, ...]]
    storage_per_gb_month: float
    egress_per_gb: float
    reliability: float
    preemptions_per_hour: float  # of interruptible offers
    inet_down_mbps: float | None = None
    location: str | None = None
    note: str = ""
    counts: tuple[int, ...] = COUNTS


@dataclass(frozen=True)
class CloudSpec:
    """A cloud: its client class, its environment variables, its documented rate limit, its snapshot."""

    name: str  # the provider name offers and jobs carry
    client: type[Any]  # the Provider class; built with ``from_settings``
    key_env: str  # e.g. VAST_API_KEY
    url_env: str  # e.g. VAST_API_URL (tests point it at a fake server)
    default_url: str
    snapshot: Snapshot
    # The documented request rate as the least gap between two requests (0: none documented; the
    # client still rides out 429s with backoff). ``rate_limit`` says it in words.
    min_interval_s: float = 0.0
    rate_limit: str = "not documented"
    # Further constructor keywords read from the environment: {"ssh_key_name": "LAMBDA_SSH_KEY_NAME"}.
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CloudAccess:
    """One cloud's key, base URL and extra constructor options, read by the registry from the variables its
    spec names (bot/providers/registry.py: cloud_access)."""

    api_key: SecretStr | None
    api_url: str
    options: Mapping[str, str] = field(default_factory=dict)
