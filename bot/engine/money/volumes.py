"""Volumes: listed with size, price and last use; idle ones are reminded about, never auto-deleted.

A volume keeps billing while nothing uses it (dstack #2497: "dozens of forgotten volumes"). The
engine posts a reminder with what it has cost so far and costs per month; only a person's explicit
delete removes it, and "keep" silences reminders for a while.

Who may delete is recorded, not guessed: a volume is *tracked* when tunebot created or attached it for
a job (``track``, or a provider volume named with the job's label ``tunebot-<job id>``), and its owner
is that job's owner. Only tracked volumes can be deleted or kept, by their owner or an admin
(``Permissions.can_manage_volume``); the provider's other volumes are listed as untracked and left to
the provider's console, whoever asks and whatever the door (Slack button, console, CLI, engine call).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select

from bot.engine.events import EngineEvent, EngineEventKind
from bot.engine.record import states as S
from bot.engine.record.spend import DAY, MONTH_SECONDS
from bot.money import money
from bot.providers.base import ProviderError, job_id_from_label
from store.models import Job, VolumeRecord

if TYPE_CHECKING:
    from sqlmodel import Session

    from bot.engine.context import EngineContext
    from bot.engine.permissions import Permissions

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
            labelled = {job_id_from_label(v.name) for v in vols} - {None}
            owners = (
                dict(s.execute(select(Job.id, Job.owner).where(Job.id.in_(sorted(labelled)))).all())  # type: ignore[arg-type]
                if labelled
                else {}
            )
            for v in vols:
                seen.add(v.volume_id)
                row = rows.get(v.volume_id)
                if row is None:
                    row = VolumeRecord(provider=name, volume_id=v.volume_id, name=v.name, first_seen_at=now)
                    s.add(row)
                row.size_gb, row.price_per_gb_month, row.name = v.size_gb, v.price_per_gb_month, v.name
                job_id = job_id_from_label(v.name)
                if not row.tracked and job_id in owners:  # created for one of our jobs, by its label
                    row.tracked, row.job_id, row.owner = True, job_id, owners[job_id]
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


def track(
    eng: EngineContext,
    provider_name: str,
    volume_id: str,
    *,
    job_id: str,
    name: str = "",
    size_gb: float = 0.0,
    price_per_gb_month: float = 0.0,
) -> VolumeRecord:
    """Record that tunebot created or attached this volume for a job: tracked, owned by the job's owner."""
    from bot.engine.api import EngineError

    now = eng.now()
    with eng.session() as s:
        job = s.get(Job, job_id)
        if job is None:
            raise EngineError(f"no job {job_id}")
        row = _live_record(s, provider_name, volume_id)
        if row is None:
            row = VolumeRecord(
                provider=provider_name,
                volume_id=volume_id,
                name=name,
                size_gb=size_gb,
                price_per_gb_month=price_per_gb_month,
                first_seen_at=now,
            )
            s.add(row)
        row.tracked, row.job_id, row.owner = True, job_id, job.owner
        S.audit(
            s,
            actor="engine",
            action="volume-track",
            job_id=job_id,
            at=now,
            provider=provider_name,
            volume_id=volume_id,
            owner=job.owner,
        )
        s.commit()
        return row


def cost_so_far(row: VolumeRecord, now: float) -> float:
    end = row.deleted_at or now
    return max(0.0, end - row.first_seen_at) * row.size_gb * row.price_per_gb_month / MONTH_SECONDS


def reminders(eng: EngineContext) -> list[EngineEvent]:
    """An idle_volume event for each volume idle longer than settings.volume_idle_days (once a day)."""
    now = eng.now()
    idle_after = eng.settings.volume_idle_days * DAY
    events: list[EngineEvent] = []
    with eng.session() as s:
        live = select(VolumeRecord).where(VolumeRecord.deleted_at.is_(None), VolumeRecord.tracked.is_(True))
        rows = list(s.execute(live).scalars())
        for row in rows:  # tunebot's own volumes: the provider's others are listed, not reminded about
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


def authorize(
    eng: EngineContext, policy: Permissions, provider_name: str, volume_id: str, *, user: str
) -> None:
    """Raise unless ``user`` may delete or keep this volume: tracked by tunebot, theirs or an admin's."""
    from bot.engine.api import EngineError, PermissionDenied

    if provider_name not in eng.providers:
        raise EngineError(f"unknown provider {provider_name!r}")
    with eng.session() as s:
        row = _live_record(s, provider_name, volume_id)
    if row is None:
        sync(eng)  # a volume listed since the last pass
        with eng.session() as s:
            row = _live_record(s, provider_name, volume_id)
    if row is None:
        raise EngineError(f"no volume {volume_id} on {provider_name} (`volumes` lists them)")
    decision = policy.can_manage_volume(user, owner=row.owner, tracked=row.tracked)
    if not decision:
        raise PermissionDenied(decision.reason)


def delete(eng: EngineContext, policy: Permissions, provider_name: str, volume_id: str, *, user: str) -> None:
    """Delete a volume because a person confirmed it (a tracked one: theirs, or any as an admin)."""
    from bot.engine.api import EngineError

    authorize(eng, policy, provider_name, volume_id, user=user)
    provider = eng.providers[provider_name]
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
    eng: EngineContext,
    policy: Permissions,
    provider_name: str,
    volume_id: str,
    *,
    user: str,
    days: float = KEEP_DAYS,
) -> None:
    authorize(eng, policy, provider_name, volume_id, user=user)
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
