"""Finished runs' measurements: recorded when a runner reports its end, imported from files, loaded for the
planner.

The planner's calibration (bot/planner/calibration.py) is pure; this module is its I/O. A finished (or
plateau) event that carries metrics becomes one `calibration_runs` row with the job's configuration (its
EstimateRequest, GPU type and count) - once per job. `tunebot calibrate import FILE` adds rows with the same
columns. After every change a snapshot of the measurements is written to `<data dir>/calibration.json`, which
`tunebot estimate` reads without opening the database (it stays a sub-second command): the database modules
are imported inside the functions that use them.

A run's figures are its host's claims: each row records the host that reported it (its provider and offer,
``local`` for the bot's own machine) and the job's owner, and the planner bounds what one host can move
(bot/planner/calibration.py): a slower or larger figure moves its class most of the way at once, one host's
by at most 2x until a second host of another owner agrees; a faster or leaner one waits for several hosts.
An admin sees which runs move which figure (``report``: `tunebot calibrate show`, `/tune calibrate`) and
excludes a run (``exclude``: `tunebot calibrate exclude JOB`, `/tune calibrate exclude JOB`); an excluded
run moves nothing until it is included again.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from bot.planner.calibration import Calibration, Measurement

if TYPE_CHECKING:
    from bot.engine.api import CalibrationView
    from bot.engine.context import EngineContext
    from runner.contract.spec import RunnerEvent
    from store.models import Job

log = logging.getLogger(__name__)

SNAPSHOT = "calibration.json"
KEEP = 2000  # newest measurements the planner pools (older ones age out)
# Columns of an import file (CSV header or JSON object keys) besides the EstimateRequest fields.
MEASURED = ("max_memory_reserved_gb", "device_memory_used_gb", "tokens_per_second", "mfu")


def _mfu(m: Measurement) -> float | None:
    """Measured MFU: the planner's FLOPs per token at the measured speed over the GPU's matmul rate."""
    from bot.planner.gpus import known
    from bot.planner.inputs import predict_measurement

    if not m.tokens_per_second:
        return None
    predicted = predict_measurement(m)
    device = known(m.gpu)
    if predicted is None or device is None or not predicted[1]:
        return None
    from bot.planner.models import resolve
    from bot.planner.request import EstimateRequest
    from bot.planner.speed import estimate_speed

    req = EstimateRequest(**{**m.request, "gpus": m.gpus, "gpu": None})
    speed = estimate_speed(resolve(req.model)[0], req, device, m.gpus)
    return round(speed.mfu * m.tokens_per_second / speed.tokens_per_second, 4)


def record_run(eng: EngineContext, job: Job, event: RunnerEvent) -> bool:
    """Store the measurements of a job's terminal event (once per job); True when a row was added."""
    metrics = event.metrics or {}
    if not job.gpu or not any(metrics.get(k) for k in MEASURED):
        return False
    request = dict(job.request or {})
    # After an out-of-memory back-off (runner/oom.py) the run measured another configuration than the
    # request's: record the one that ran, so the planner is compared with what it would have said for it.
    for key, field, cast in (
        ("micro_batch_size", "batch_size", int),
        ("grad_accum", "grad_accum", int),
        ("gradient_checkpointing", "gradient_checkpointing", bool),
    ):
        if metrics.get(key) is not None:
            request[field] = cast(metrics[key])
    try:
        m = Measurement(
            gpu=job.gpu,
            gpus=job.gpu_count or 1,
            request=request,
            max_memory_reserved_gb=metrics.get("max_memory_reserved_gb") or None,
            device_memory_used_gb=metrics.get("device_memory_used_gb") or None,
            tokens_per_second=metrics.get("tokens_per_second") or None,
            job_id=job.id,
            host=reporting_host(eng, job),
            owner=job.owner,
            device=(job.offer or {}).get("cpu") if job.gpu == "cpu" else None,
        )
    except ValidationError as exc:
        log.warning("job %s: measurements not recorded: %s", job.id, exc)
        return False
    added = add(eng, [m.model_copy(update={"mfu": _mfu(m), "recorded_at": eng.now()})])
    return added == 1


def reporting_host(eng: EngineContext, job: Job) -> str:
    """The host a job's runner reports from: its newest instance's provider and offer (the machine, as far as
    the cloud says), ``local`` on the bot's own machine."""
    from sqlalchemy import select

    from bot.planner.calibration import LOCAL_HOST
    from store.models import Instance

    with eng.session() as s:
        row = s.execute(
            select(Instance.provider, Instance.offer_id, Instance.provider_instance_id)
            .where(Instance.job_id == job.id)
            .order_by(Instance.id.desc())
            .limit(1)
        ).first()
    provider = row[0] if row else (job.provider or "?")
    provider_obj = eng.supervisable.get(provider)
    if provider == "local" or getattr(getattr(provider_obj, "capabilities", None), "kind", None) == "local":
        return LOCAL_HOST
    where = (row[1] or row[2]) if row else None
    return f"{provider}:{where or job.id}"[:200]


def add(eng: EngineContext, measurements: list[Measurement]) -> int:
    """Insert measurements (a job's run at most once); refresh the snapshot; returns how many were new."""
    from sqlalchemy.exc import IntegrityError

    from store.models import CalibrationRun

    added = 0
    for m in measurements:
        job_id = m.job_id
        if job_id is None:  # an imported row: the same row imported twice is one measurement
            content = json.dumps(m.model_dump(exclude={"recorded_at", "source"}), sort_keys=True)
            job_id = "import:" + hashlib.sha256(content.encode()).hexdigest()[:24]
        row = CalibrationRun(
            job_id=job_id,
            source=m.source,
            recorded_at=m.recorded_at or eng.now(),
            gpu=m.gpu,
            gpus=m.gpus,
            request=m.request,
            max_memory_reserved_gb=m.max_memory_reserved_gb,
            device_memory_used_gb=m.device_memory_used_gb,
            tokens_per_second=m.tokens_per_second,
            mfu=m.mfu,
            host=m.host,
            owner=m.owner,
            device=m.device,
        )
        with eng.session() as s:
            s.add(row)
            try:
                s.commit()
                added += 1
            except IntegrityError:  # this job's run is already recorded (a re-read progress object)
                s.rollback()
    if added:
        write_snapshot(eng.settings.data_dir, load(eng))
    return added


def load(eng: EngineContext, limit: int = KEEP, *, excluded: bool = False) -> list[Measurement]:
    """The newest measurements, oldest first; an admin's excluded runs only with ``excluded``."""
    return [m for m, _ in rows(eng, limit, excluded=excluded)]


def rows(eng: EngineContext, limit: int = KEEP, *, excluded: bool = False) -> list[tuple[Measurement, Any]]:
    """(measurement, its store row) for the newest runs, oldest first."""
    from sqlalchemy import select

    from store.models import CalibrationRun

    q = select(CalibrationRun)
    if not excluded:
        q = q.where(CalibrationRun.excluded_at.is_(None))
    with eng.session() as s:
        found = s.execute(q.order_by(CalibrationRun.id.desc()).limit(limit)).scalars().all()
    return [
        (
            Measurement(
                gpu=r.gpu,
                gpus=r.gpus,
                request=r.request,
                max_memory_reserved_gb=r.max_memory_reserved_gb,
                device_memory_used_gb=r.device_memory_used_gb,
                tokens_per_second=r.tokens_per_second,
                mfu=r.mfu,
                job_id=r.job_id,
                source=r.source,
                recorded_at=r.recorded_at,
                host=r.host,
                owner=r.owner,
                device=r.device,
            ),
            r,
        )
        for r in reversed(found)
    ]


def version(eng: EngineContext) -> tuple[int, int, float]:
    """(count, newest id, exclusions): changes whenever a measurement is added, excluded or included."""
    from sqlalchemy import func, select

    from store.models import CalibrationRun

    with eng.session() as s:
        count, newest, excluded = s.execute(
            select(
                func.count(CalibrationRun.id),
                func.max(CalibrationRun.id),
                func.coalesce(func.sum(CalibrationRun.excluded_at), 0.0),
            )
        ).one()
    return int(count or 0), int(newest or 0), float(excluded or 0.0)  # type: ignore[return-value]


def calibration_for(eng: EngineContext) -> Calibration:
    """The planner's corrections from the stored measurements, recomputed only when they changed."""
    from bot.planner.inputs import calibrate

    current = version(eng)
    cached = eng.memory.calibration
    if cached is None or cached[0] != current:
        cached = (current, calibrate(load(eng)) if current[0] else Calibration())
        eng.memory.calibration = cached
    return cached[1]


# ---- what moved a figure, and undoing it (admins)
# ------------------------------------------------


def report(eng: EngineContext, *, user: str, policy: Any = None) -> CalibrationView:
    """Every stored run (excluded ones too) with its job, host and owner, the figures it claims and whether
    it counts (``counted`` | ``held`` at one host's bound | ``waiting`` for corroboration | ``excluded`` |
    ``skipped``), and the
    corrections: what an admin reads before excluding a run. Admins only (the operator is one)."""
    from bot.engine.api import CalibrationLine, CalibrationRunView, CalibrationView
    from bot.planner.calibration import explain
    from bot.planner.inputs import predict_measurement

    _admin_only(eng, user, policy, "see the runs behind the calibration")
    everything = rows(eng, excluded=True)
    live = [(m, r) for m, r in everything if r.excluded_at is None]
    cal, explained = explain([m for m, _ in live], predict_measurement)
    why = {id(r): e for (_, r), e in zip(live, explained, strict=True)}
    runs = []
    for _, r in everything:
        e = why.get(id(r))
        if r.excluded_at is not None:
            status = "excluded"
        elif e is None or e.key is None:
            status = "skipped"
        elif e.memory_waiting or e.speed_waiting:
            status = "waiting"
        elif e.memory_held or e.speed_held:
            status = "held"
        else:
            status = "counted"
        runs.append(
            CalibrationRunView(
                run=r.job_id or str(r.id),
                source=r.source,
                job_id=r.job_id if r.source != "import" else None,
                host=r.host,
                owner=r.owner,
                gpu=r.gpu,
                key=list(e.key) if e is not None and e.key else None,
                memory_x=_ratio(e.memory_log_ratio if e else None),
                speed_x=_ratio(e.speed_log_ratio if e else None),
                status=status,  # type: ignore[arg-type]
                excluded_by=r.excluded_by,
            )
        )
    lines = [
        CalibrationLine(
            gpu=c.key[0],
            stack=c.key[1],
            method=c.key[2],
            size=c.key[3],
            speed_factor=round(c.speed_factor, 4),
            speed_runs=c.speed_runs,
            speed_waiting=c.speed_waiting,
            memory_factor=round(c.memory_factor, 4),
            memory_runs=c.memory_runs,
            memory_waiting=c.memory_waiting,
            speed_held=c.speed_held,
            memory_held=c.memory_held,
        )
        for c in sorted(cal.corrections.values(), key=lambda c: c.key)
    ]
    return CalibrationView(measurements=len(live), skipped=cal.skipped, corrections=lines, runs=runs)


def _ratio(log_ratio: float | None) -> float | None:
    import math

    return None if log_ratio is None else round(math.exp(log_ratio), 4)


def _admin_only(eng: EngineContext, user: str, policy: Any, what: str) -> None:
    from bot.engine.api import PermissionDenied

    policy = policy or eng.policy
    if not policy.is_admin(user):
        raise PermissionDenied(f"only admins {what} (TUNEBOT_ADMINS; the operator on the bot's machine)")


def exclude(eng: EngineContext, run: str, *, user: str, policy: Any = None, undo: bool = False) -> str:
    """Exclude a run from calibration (``undo``: include it again), by its job id (or an import's id, as
    `calibrate show` lists it); admins only. Returns what was done, for the person; EngineError when there
    is no such run."""
    from sqlalchemy import update

    from bot.engine.api import EngineError
    from store.models import CalibrationRun

    _admin_only(eng, user, policy, "exclude runs from the calibration")
    run = (run or "").strip()
    if not run or len(run) > 64 or any(ord(c) < 33 for c in run):
        raise EngineError("name a run as `calibrate show` lists it (its job id)")
    with eng.session() as s:
        row = s.execute(select_run(run)).scalars().first()
        if row is None:
            raise EngineError(f"no calibration run {run} (`calibrate show` lists them)")
        values = (
            {"excluded_at": None, "excluded_by": None}
            if undo
            else {"excluded_at": eng.now(), "excluded_by": user}
        )
        s.execute(update(CalibrationRun).where(CalibrationRun.id == row.id).values(**values))
        from bot.engine.record import states as S

        S.audit(
            s,
            actor=user,
            action="calibration-include" if undo else "calibration-exclude",
            job_id=row.job_id if row.source != "import" else None,
            at=eng.now(),
            run=row.job_id,
            host=row.host,
            owner=row.owner,
        )
        s.commit()
    write_snapshot(eng.settings.data_dir, load(eng))
    eng.memory.calibration = None
    where = f" (host {row.host}, owner {row.owner})" if row.host or row.owner else ""
    if undo:
        return f"run {run}{where} counts for the calibration again"
    return (
        f"run {run}{where} is excluded: it no longer moves any estimate (`calibrate include {run}` undoes it)"
    )


def select_run(run: str) -> Any:
    from sqlalchemy import select

    from store.models import CalibrationRun

    return select(CalibrationRun).where(CalibrationRun.job_id == run)


# ---- the snapshot `tunebot estimate` reads, and import files
# ------------------------------------------------


def write_snapshot(data_dir: Path, measurements: list[Measurement]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"measurements": [m.model_dump(mode="json") for m in measurements]})
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=".calibration-", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(payload)
    os.replace(tmp, data_dir / SNAPSHOT)


def read_snapshot(data_dir: Path) -> list[Measurement]:
    """The measurements of the last snapshot; [] when there is none or it cannot be read."""
    try:
        raw = json.loads((data_dir / SNAPSHOT).read_text())
        return [Measurement.model_validate(m) for m in raw.get("measurements", [])]
    except (OSError, ValueError, AttributeError):
        return []


class CalibrationImportError(ValueError):
    """An import file that cannot be read; the message says where and why."""


def _number(value: Any, where: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise CalibrationImportError(f"{where}: {value!r} is not a number") from None
    if out != out or out <= 0:
        raise CalibrationImportError(f"{where}: {value!r} must be a positive number")
    return out


def parse_import(text: str, name: str = "file") -> list[Measurement]:
    """Measurements from CSV (a header row) or JSON (a list of objects, or {"measurements": [...]}).

    Columns: gpu, gpus, the EstimateRequest fields that describe the run (model, method, seq_len, batch_size,
    lora_r, lora_targets, grad_accum, gradient_checkpointing, attn, optimizer, stack, ...), and the measured
    max_memory_reserved_gb, device_memory_used_gb, tokens_per_second (at least one of them); optional mfu."""
    from bot.planner.gpus import gpu as lookup_gpu
    from bot.planner.request import EstimateRequest

    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CalibrationImportError(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        rows = data.get("measurements") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise CalibrationImportError(f'{name}: expected a list of objects (or {{"measurements": [...]}})')
        numbered = [(f"{name} item {i + 1}", r) for i, r in enumerate(rows)]
    else:
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or "gpu" not in reader.fieldnames:
            raise CalibrationImportError(
                f"{name}: a CSV needs a header row with at least gpu and model columns"
            )
        numbered = [(f"{name} line {i + 2}", dict(r)) for i, r in enumerate(reader)]
    if not numbered:
        raise CalibrationImportError(f"{name}: no measurements")
    out: list[Measurement] = []
    request_fields = set(EstimateRequest.model_fields) - {"gpu", "gpus", "tokens", "dataset", "epochs"}
    for where, row in numbered:
        row = {k.strip(): v for k, v in row.items() if k is not None}
        measured = {k: _number(row.get(k), f"{where}: {k}") for k in MEASURED}
        if not any(measured[k] for k in MEASURED[:3]):
            raise CalibrationImportError(
                f"{where}: no measurement (max_memory_reserved_gb, device_memory_used_gb or "
                "tokens_per_second)"
            )
        try:
            gpu_name = lookup_gpu(str(row.get("gpu") or "")).name
        except ValueError as exc:
            raise CalibrationImportError(f"{where}: {exc}") from None
        request = {k: v for k, v in row.items() if k in request_fields and v not in (None, "")}
        if isinstance(request.get("lora_targets"), str) and request["lora_targets"] != "all-linear":
            request["lora_targets"] = [t.strip() for t in request["lora_targets"].split(",") if t.strip()]
        try:
            EstimateRequest(**request)  # the configuration must be one the planner understands
            gpus = int(float(row.get("gpus") or 1))
            out.append(Measurement(gpu=gpu_name, gpus=gpus, request=request, source="import", **measured))
        except (ValidationError, ValueError) as exc:
            first = exc.errors()[0] if isinstance(exc, ValidationError) else {"msg": str(exc), "loc": ()}
            field = ".".join(str(p) for p in first.get("loc", ()))
            raise CalibrationImportError(f"{where}: {field + ': ' if field else ''}{first['msg']}") from None
    return out


def import_columns() -> list[str]:
    """The CSV header `calibrate import` understands (bench/gpu_check writes it)."""
    return [
        "gpu",
        "gpus",
        "model",
        "method",
        "stack",
        "seq_len",
        "batch_size",
        "grad_accum",
        "lora_r",
        "lora_targets",
        "gradient_checkpointing",
        "attn",
        "optimizer",
        "loss",
        *MEASURED,
    ]
