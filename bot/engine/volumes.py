"""Volumes: tracked with size, price and last use; idle ones are reminded about, never auto-deleted.

A volume keeps billing while nothing uses it (dstack #2497: "dozens of forgotten volumes"). The
engine posts a reminder with what it has cost so far and costs per month; only a person's explicit
delete removes it, and "keep" silences reminders for a while.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select

from bot.engine import states as S
from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.spend import DAY, MONTH_SECONDS
from bot.money import money
from bot.providers.base import ProviderError
from store.models import VolumeRecord

if TYPE_CHECKING:
    from sqlmodel import Session

    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)
KEEP_DAYS = 30.0


def sync(eng: EngineContext) -> int:
    """Refresh the volume table from every provider that has volumes; returns how many are live."""
    now = eng.now()
    live = 0
    for name, provider in eng.providers.items():
        if not getattr(provider.capabilities, "volumes", False):
            continue
        try:
            vols = provider.list_volumes()
        except ProviderError as exc:
            log.warning("listing volumes of %s failed: %s", name, exc)
            continue
        with eng.session() as s:
            rows = {
                r.volume_id: r
                for r in s.execute(
                    select(VolumeRecord).where(
                        VolumeRecord.provider == name, VolumeRecord.deleted_at.is_(None)
                    )
                ).scalars()
            }
            seen = set()
            for v in vols:
                seen.add(v.volume_id)
                row = rows.get(v.volume_id)
                if row is None:
                    row = VolumeRecord(provider=name, volume_id=v.volume_id, name=v.name, first_seen_at=now)
                    s.add(row)
                row.size_gb, row.price_per_gb_month, row.name = v.size_gb, v.price_per_gb_month, v.name
                if v.attached:
                    row.last_used_at, row.idle_since = now, None
                elif row.idle_since is None:
                    row.idle_since = v.idle_since.timestamp() if v.idle_since else (row.last_used_at or now)
            for vid, row in rows.items():
                if vid not in seen:
                    row.deleted_at = now
            s.commit()
            live += len(seen)
    return live


def cost_so_far(row: VolumeRecord, now: float) -> float:
    end = row.deleted_at or now
    return max(0.0, end - row.first_seen_at) * row.size_gb * row.price_per_gb_month / MONTH_SECONDS


def reminders(eng: EngineContext) -> list[EngineEvent]:
    """An idle_volume event for each volume idle longer than settings.volume_idle_days (once a day)."""
    now = eng.now()
    idle_after = eng.settings.volume_idle_days * DAY
    events: list[EngineEvent] = []
    with eng.session() as s:
        rows = list(s.execute(select(VolumeRecord).where(VolumeRecord.deleted_at.is_(None))).scalars())
        for row in rows:
            idle_since = row.idle_since
            if idle_since is None or now - idle_since < idle_after:
                continue
            if row.keep_until and row.keep_until > now:
                continue
            if row.reminded_at and now - row.reminded_at < DAY:
                continue
            row.reminded_at = now
            per_month = row.size_gb * row.price_per_gb_month
            so_far = cost_so_far(row, now)
            days = (now - idle_since) / DAY
            events.append(
                EngineEvent(
                    kind=EngineEventKind.idle_volume,
                    user=row.owner,
                    message=f"Volume {row.name or row.volume_id} on {row.provider} ({row.size_gb:g} GB) "
                    f"has been idle for {days:.0f} days: {money(so_far)} so far, {money(per_month)} per "
                    f"month. Delete it or keep it?",
                    data={
                        "provider": row.provider,
                        "volume_id": row.volume_id,
                        "size_gb": row.size_gb,
                        "cost_so_far": round(so_far, 4),
                        "cost_per_month": round(per_month, 4),
                        "idle_days": round(days, 2),
                    },
                    at=now,
                )
            )
        s.commit()
    for ev in events:
        eng.bus.publish(ev)
    return events


def delete(eng: EngineContext, provider_name: str, volume_id: str, *, user: str) -> None:
    """Delete a volume because a person confirmed it."""
    from bot.engine.api import EngineError

    provider = eng.providers.get(provider_name)
    if provider is None:
        raise EngineError(f"unknown provider {provider_name!r}")
    try:
        provider.delete_volume(volume_id)
    except ProviderError as exc:
        raise EngineError(f"could not delete volume {volume_id} on {provider_name}: {exc}") from exc
    now = eng.now()
    with eng.session() as s:
        row = _live_record(s, provider_name, volume_id)
        if row is not None:
            row.deleted_at, row.deleted_by = now, user
        S.audit(
            s,
            actor=user,
            action="volume-delete",
            job_id=None,
            at=now,
            provider=provider_name,
            volume_id=volume_id,
        )
        s.commit()


def keep(
    eng: EngineContext, provider_name: str, volume_id: str, *, user: str, days: float = KEEP_DAYS
) -> None:
    now = eng.now()
    with eng.session() as s:
        row = _live_record(s, provider_name, volume_id)
        if row is None:
            from bot.engine.api import EngineError

            raise EngineError(f"no volume {volume_id} on {provider_name}")
        row.keep_until = now + days * DAY
        S.audit(
            s,
            actor=user,
            action="volume-keep",
            job_id=None,
            at=now,
            provider=provider_name,
            volume_id=volume_id,
            days=days,
        )
        s.commit()


def _live_record(s: Session, provider_name: str, volume_id: str) -> VolumeRecord | None:
    """The volume's row unless it is already recorded as deleted."""
    query = select(VolumeRecord).where(
        VolumeRecord.provider == provider_name,
        VolumeRecord.volume_id == volume_id,
        VolumeRecord.deleted_at.is_(None),
    )
    return s.execute(query).scalars().first()
