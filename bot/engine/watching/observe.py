"""The instance's status as its provider says it: one listing per provider per tick, then a verdict.

Preemption is read from the provider's status (preempted, stopped, exited with 75, gone) and, as a
fallback (bot/engine/watching/supervise.py), from missing heartbeats: a running instance with no event for
``heartbeat_timeout_s``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from bot.providers.base import Instance, InstanceStatus, NotFoundError, ProviderError
from runner.contract.spec import (
    EXIT_CREDENTIALS,
    EXIT_PREEMPTED,
)
from store.db import update_each, update_in
from store.models import Instance as InstanceRow

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

try:  # a first read parses every object whole: orjson does it in a quarter of json's time
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency; plain json still works
    _loads = json.loads

log = logging.getLogger(__name__)

# 75: the runner saved and exited on SIGTERM; 77: it saved and exited before its storage credentials
# expired (not renewed; a relaunch gets fresh ones); 143/137: killed by SIGTERM/SIGKILL from outside (a
# reclaim that came before the runner's handler was installed, or after its grace) - all worth a relaunch.
PREEMPTED_EXIT_CODES = frozenset({EXIT_PREEMPTED, EXIT_CREDENTIALS, 128 + 15, 128 + 9})


def observe(eng: EngineContext, row: InstanceRow) -> tuple[str, int | None]:
    """Ask the provider: (verdict, exit code), verdict running|provisioning|unknown|preempted|exited|gone.

    Provider trouble (down, rate limited) returns "error": nothing is decided on a failed call.
    """
    seen = observe_many(eng, [row])
    return seen[row.id]  # type: ignore[index]


def observe_many(eng: EngineContext, rows: list[InstanceRow]) -> dict[int, tuple[str, int | None]]:
    """The verdicts of many instance rows: one listing per provider, a per-instance ``status`` only for
    a provider without a listing and for a row its listing does not show (just launched, or gone: the
    status call says which). Refreshed statuses are written in one transaction."""
    out: dict[int, tuple[str, int | None]] = {}
    by_provider: dict[str, list[InstanceRow]] = {}
    for r in rows:
        by_provider.setdefault(r.provider, []).append(r)
    seen = _Seen(eng.now())
    listings = _listings(eng, {n: g for n, g in by_provider.items() if len(g) > 1})
    for name, group in by_provider.items():
        provider = eng.supervisable.get(name)
        listed = listings.get(name)
        if provider is None:
            out.update({r.id: ("error", None) for r in group})  # type: ignore[misc]
            continue  # not configured in this process: decide nothing
        if isinstance(listed, ProviderError):
            log.warning("listing %s failed: %s; deciding nothing for its %d jobs", name, listed, len(group))
            out.update({r.id: ("error", None) for r in group})  # type: ignore[misc]
            continue
        for r in group:
            inst = listed.get(r.provider_instance_id) if listed is not None else None
            if inst is None or inst.status == InstanceStatus.terminated:
                inst = _status(provider, r, out)
                if inst is None:
                    continue
            out[r.id] = verdict(inst)  # type: ignore[index]
            seen.note(r, inst)
    seen.write(eng)
    return out


def _status(provider: Any, r: InstanceRow, out: dict[int, tuple[str, int | None]]) -> Instance | None:
    """One instance's status asked alone; None with the verdict in ``out`` when the answer is none."""
    try:
        return provider.status(r.provider_instance_id)  # type: ignore[no-any-return]
    except NotFoundError:
        out[r.id] = ("gone", None)  # type: ignore[index]
    except ProviderError as exc:
        log.warning("status of %s/%s failed: %s", r.provider, r.provider_instance_id, exc)
        out[r.id] = ("error", None)  # type: ignore[index]
    return None


def _listings(eng: EngineContext, groups: dict[str, list[Any]]) -> dict[str, Any]:
    """Each provider's listing by instance id, asked concurrently (a slow cloud does not delay the
    others); a ProviderError where the listing failed; absent where the provider has no listing."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> Any:
        provider = eng.supervisable.get(name)
        if provider is None:
            return None
        try:
            return {i.instance_id: i for i in provider.list_instances()}
        except NotImplementedError:
            return None
        except ProviderError as exc:
            return exc

    names = [n for n in groups if n in eng.supervisable]
    if len(names) <= 1:
        return {n: one(n) for n in names}
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


SEEN_EVERY_S = 30.0  # an unchanged instance's last-seen time is rewritten at most this often


class _Seen:
    """What the providers said of the rows, to be written: a changed status at once, an unchanged one's
    last-seen time at most every SEEN_EVERY_S."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.changed: list[dict[str, Any]] = []
        self.same: list[int] = []

    def note(self, r: InstanceRow, inst: Instance) -> None:
        if r.status != inst.status or r.raw_status != inst.raw_status or r.exit_code != inst.exit_code:
            self.changed.append(
                {
                    "id": r.id,
                    "status": str(inst.status),
                    "raw_status": inst.raw_status,
                    "exit_code": inst.exit_code,
                    "last_seen_at": self.now,
                }
            )
        elif self.now - (r.last_seen_at or 0.0) >= SEEN_EVERY_S:
            self.same.append(r.id)  # type: ignore[arg-type]

    def write(self, eng: EngineContext) -> None:
        if not self.changed and not self.same:
            return
        with eng.session() as s:
            update_each(s, InstanceRow, self.changed)
            update_in(s, InstanceRow, self.same, last_seen_at=self.now)
            s.commit()


def verdict(inst: Instance) -> tuple[str, int | None]:
    """A provider's normalized status as the supervisor reads it (pure)."""
    st = inst.status
    if st == InstanceStatus.terminated:
        return "gone", inst.exit_code
    if st == InstanceStatus.preempted:
        return "preempted", inst.exit_code
    if st == InstanceStatus.exited:
        if inst.exit_code in PREEMPTED_EXIT_CODES:
            return "preempted", inst.exit_code
        return "exited", inst.exit_code
    if st == InstanceStatus.stopped:
        return "preempted", inst.exit_code  # a stop we did not ask for (Vast outbid pauses the instance)
    if st == InstanceStatus.provisioning:
        return "provisioning", None
    if st == InstanceStatus.running:
        return "running", None
    return "unknown", None
