"""What the bot accepts from a runner: only what that job's key signed, within bounds, linking where expected.

A rented host is hostile (../shared/docs/security.md), and storage may be shared with other jobs' hosts.
So:

- **Per-run keys.** Each launch of a job is a run (bot/engine/record/runs.py) with its own key: ``run_key`` =
  HMAC-SHA256(master key, "tunebot run key v1" + job id + run id + the run's random secret, kept in
  ``job_runs``). A key derived from the job id alone would be the same in every run, and a host that ran the
  job once would keep it. The master key is ``TUNEBOT_SECRET_KEY`` where set (then no run's key can be
  recomputed from the database); else one is made at first use and kept in ``bot_secrets``, so every replica
  derives the same keys. The instance gets its run's key as ``TUNEBOT_JOB_KEY`` (never in the spec or a
  message). ``current_key`` is the key of the job's current run (``jobs.run_id``, read from the database each
  time: another replica may have launched a new run), None between runs: nothing is accepted then. A run
  launched before runs existed is named ``legacy`` and keeps the old job-wide key until it ends.
- **Events** pushed (``/runner/events``) or pulled (progress.json) count only with a valid MAC of the job's
  current run (runner/contract/integrity.py, ``hmac.compare_digest``); anything else is ignored and told
  once in the job's thread (``report_refused``). Events for a final job are refused on both paths
  (runner_events.ingest).
- **Caps**: an event over ``MAX_EVENT_BYTES`` is refused; messages, URIs and metrics are cut to their caps;
  a progress object over ``MAX_PROGRESS_BYTES`` is not read; a job stores at most ``MAX_STORED_EVENTS``
  events (later ones still move its progress, without a row each).
- **Links**: an event's output and checkpoint URIs must lie under the job's own prefixes, its W&B URL on
  W&B, its Hub URL on the repo the job was told to push to; anything else is dropped (and told).

The checks on one event are pure (``check_links``, ``cap_event``), tested directly.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from runner.contract.integrity import EVENT, MAC_FIELD, canonical, verify

# Every cap on an event is the contract's (runner/contract/spec.py): the runner splits a report so that
# none is over them.
from runner.contract.spec import (
    MAX_EVENT_BYTES,
    MAX_EVENT_METRICS,
    MAX_MESSAGE_CHARS,
    MAX_METRIC_NAME,
    MAX_PROGRESS_BYTES,
    MAX_URI_CHARS,
    RunnerEvent,
    readable_events,
)

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

try:  # the fast path of the MAC check (``_fast_canonical``); without it the exact check alone
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

KEY_PURPOSE = b"tunebot job key v1\0"  # the job-wide key of a run launched before runs existed (legacy)
RUN_KEY_PURPOSE = b"tunebot run key v1\0"
LEGACY_RUN = "legacy"
MASTER_NAME = "job-keys"
MAX_STORED_EVENTS = 20_000  # rows per job: seq 0 .. 19,999 (a week of progress every 30 s)
WANDB_HOSTS = ("wandb.ai",)

REASONS = {
    "unsigned": "not signed with this job's key (that of its current run: an earlier run's host, or someone "
    "else who wrote to its storage)",
    "too_large": f"over {MAX_EVENT_BYTES // 1024} KB",
    "object_too_large": f"a progress object over {MAX_PROGRESS_BYTES >> 20} MB",
    "link": "a link outside this job's storage, W&B or its Hub repo (dropped)",
}


# ---- keys ---------------------------------------------------------------------------------------------


def master_key(ctx: EngineContext) -> bytes:
    """The bot's master key (TUNEBOT_SECRET_KEY, else the one kept in the database), read once."""
    mem = ctx.memory
    if mem.job_master_key is not None:
        return mem.job_master_key
    configured = ctx.settings.secret_key
    if configured is not None and configured.get_secret_value():
        key = hashlib.sha256(configured.get_secret_value().encode()).digest()
    else:
        key = _stored_master(ctx)
    mem.job_master_key = key
    return key


def _stored_master(ctx: EngineContext) -> bytes:
    from store.db import insert_for
    from store.models import BotSecret

    with ctx.session() as s:
        row = s.get(BotSecret, MASTER_NAME)
        if row is None:  # first use: made once; replicas starting together converge on one row
            stmt = insert_for(s, BotSecret).values(
                name=MASTER_NAME, value=secrets.token_hex(32), created_at=ctx.now()
            )
            s.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
            s.commit()
            row = s.get(BotSecret, MASTER_NAME)
        assert row is not None
        return bytes.fromhex(row.value)


def job_key(ctx: EngineContext, job_id: str) -> bytes:
    """The job-wide key of before runs: only a ``legacy`` run (launched before the upgrade) still signs with
    it, until it ends."""
    return hmac.new(master_key(ctx), KEY_PURPOSE + job_id.encode(), hashlib.sha256).digest()


def derive_run_key(master: bytes, job_id: str, run_id: str, secret: str) -> bytes:
    """A run's key from the master key, the job and run ids and the run's random secret (hex). Pure."""
    body = RUN_KEY_PURPOSE + job_id.encode() + b"\0" + run_id.encode() + b"\0" + bytes.fromhex(secret)
    return hmac.digest(master, body, "sha256")


def run_key(ctx: EngineContext, job_id: str, run_id: str) -> bytes | None:
    """The key of one run of the job (what its instance gets as TUNEBOT_JOB_KEY, in hex); None when there is
    no such run. Cached per (job, run): a run's key never changes."""
    if run_id == LEGACY_RUN:
        return job_key(ctx, job_id)
    cached = ctx.memory.run_keys.get((job_id, run_id))
    if cached is not None:
        return cached
    from store.models import JobRun

    with ctx.session() as s:
        row = s.get(JobRun, run_id)
    if row is None or row.job_id != job_id:
        return None
    key = derive_run_key(master_key(ctx), job_id, run_id, row.secret)
    ctx.memory.run_keys[(job_id, run_id)] = key
    return key


def load_run_keys(ctx: EngineContext, runs: dict[str, str | None]) -> None:
    """Derive and cache the keys of these (job id -> run id) runs not cached yet, reading their rows in a
    few queries: a restarted bot's first tick needs every running job's key, and one query per job was
    most of that tick. ``run_key`` then finds them cached (what it returns is unchanged)."""
    cache = ctx.memory.run_keys
    wanted = {
        (jid, rid) for jid, rid in runs.items() if rid and rid != LEGACY_RUN and (jid, rid) not in cache
    }
    if not wanted:
        return
    from sqlalchemy import select

    from bot.engine.record.states import ACTIVE
    from store.models import Job, JobRun

    master = master_key(ctx)
    ids = sorted({rid for _, rid in wanted})
    cols = (JobRun.id, JobRun.job_id, JobRun.secret)
    if len(ids) > 500:  # many (a restarted bot's first tick): the current runs of all jobs, filtered here,
        # in one query instead of one per 500 IN-list parameters (a second on PostgreSQL at 10,000 jobs)
        q = select(*cols).join(Job, Job.run_id == JobRun.id).where(Job.state.in_(sorted(ACTIVE)))
    else:
        q = select(*cols).where(JobRun.id.in_(ids))
    with ctx.db.connect() as conn:
        for run_id, job_id, secret in conn.execute(q):
            if (job_id, run_id) in wanted:  # a run of another job is no key of this one
                cache[(job_id, run_id)] = derive_run_key(master, job_id, run_id, secret)


def current_key(ctx: EngineContext, job_id: str, run_id: str | None = None) -> tuple[str, bytes] | None:
    """(run id, key) of the job's current run, None when it has none (between runs: nothing is accepted).
    ``run_id``: the job's ``run_id`` column as the caller just read it (saves a query)."""
    if run_id is None:
        from store.models import Job

        with ctx.session() as s:
            job = s.get(Job, job_id)
        run_id = job.run_id if job is not None else None
    if not run_id:
        return None
    key = run_key(ctx, job_id, run_id)
    return (run_id, key) if key is not None else None


# ---- events -------------------------------------------------------------------------------------------


def refusal(key: bytes, item: Any) -> str | None:
    """Why an event object does not count ("too_large", "unsigned"), None when it does: within the size
    cap and signed with ``key``. Its canonical bytes are made once, for both checks. Pure."""
    fast = _fast_canonical(item)
    if fast is not None and len(fast) <= MAX_EVENT_BYTES and verify(key, EVENT, item, fast):
        return None
    try:
        body = canonical(item)
    except (TypeError, ValueError, AttributeError):
        return "unsigned"
    if len(body) > MAX_EVENT_BYTES:
        return "too_large"
    return None if verify(key, EVENT, item, body) else "unsigned"


def signed_event(key: bytes, item: Any) -> bool:
    """Whether ``key`` signed the event object (``verify``'s verdict, its fast path first, as ``refusal``'s;
    no size cap). Pure."""
    fast = _fast_canonical(item)
    if fast is not None and verify(key, EVENT, item, fast):
        return True
    return verify(key, EVENT, item)


def _fast_canonical(item: Any) -> bytes | None:
    """The canonical bytes as orjson writes them (a third of json.dumps's time, stripping the MAC
    included), or None. They differ from ``canonical``'s for some objects (non-ASCII text, exponents, NaN):
    then the MAC does not match them and the exact check decides. When it does match, the runner signed
    exactly these bytes, which are ``canonical``'s for this object: the verdict is the exact check's."""
    if _orjson is None or not isinstance(item, dict):
        return None
    body = item.copy()  # a C-level copy: the comprehension it replaces was most of the fast path's time
    body.pop(MAC_FIELD, None)
    try:
        return _orjson.dumps(body, option=_orjson.OPT_SORT_KEYS)
    except (TypeError, ValueError):
        return None


def signed_events(key: bytes, job_id: str, items: Iterable[Any]) -> tuple[list[RunnerEvent], Counter[str]]:
    """The readable events of this job among ``items`` that the job's key signed, in seq order, and the
    count of the others by reason. Pure."""
    refused: Counter[str] = Counter()
    good: list[Any] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        why = refusal(key, item)
        if why:
            refused[why] += 1
        else:
            good.append(item)
    return [e for e in readable_events(good) if e.job_id == job_id], refused


@dataclass(frozen=True)
class Expected:
    """Where a job's events may point: its own prefixes, W&B, the Hub repo it was told to push to."""

    output_prefix: str
    checkpoint_prefix: str | None = None
    hub_repo: str | None = None
    hub_base: str = "https://huggingface.co"
    wandb_hosts: tuple[str, ...] = WANDB_HOSTS


def _under(uri: str, prefix: str | None) -> bool:
    if not prefix:
        return False
    prefix = prefix.rstrip("/")
    if ".." in uri.split("/") or "%2e" in uri.lower():
        return False
    return uri == prefix or uri.startswith(prefix + "/")


def _https_on(url: str, hosts: Iterable[str]) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    return (
        parts.scheme == "https"
        and not parts.username
        and any(host == h or host.endswith("." + h) for h in hosts)
    )


def check_links(event: RunnerEvent, expected: Expected) -> tuple[RunnerEvent, int]:
    """The event with every link that does not point where this job's may dropped; how many were. Pure."""
    drop: dict[str, None] = {}
    if event.output_uri and not _under(event.output_uri, expected.output_prefix):
        drop["output_uri"] = None
    if event.checkpoint_uri and not _under(event.checkpoint_uri, expected.checkpoint_prefix):
        drop["checkpoint_uri"] = None
    if event.wandb_url and not _https_on(event.wandb_url, expected.wandb_hosts):
        drop["wandb_url"] = None
    if event.hub_url:
        repo_url = f"{expected.hub_base.rstrip('/')}/{expected.hub_repo}" if expected.hub_repo else None
        if repo_url is None or not _under(event.hub_url, repo_url):
            drop["hub_url"] = None
    return (event.model_copy(update=drop) if drop else event), len(drop)


def cap_event(event: RunnerEvent) -> RunnerEvent:
    """The event with its free-text and link fields cut to their caps, and at most MAX_EVENT_METRICS
    metrics."""
    update: dict[str, Any] = {}
    if event.message and len(event.message) > MAX_MESSAGE_CHARS:
        update["message"] = event.message[:MAX_MESSAGE_CHARS]
    for name in ("output_uri", "checkpoint_uri", "wandb_url", "hub_url"):
        value = getattr(event, name)
        if value and len(value) > MAX_URI_CHARS:
            update[name] = None
    metrics = event.metrics
    if metrics and (len(metrics) > MAX_EVENT_METRICS or any(len(k) > MAX_METRIC_NAME for k in metrics)):
        kept = list(metrics.items())[:MAX_EVENT_METRICS]
        update["metrics"] = {k: v for k, v in kept if len(k) <= MAX_METRIC_NAME}
    return event.model_copy(update=update) if update else event


def expected_of(ctx: EngineContext, job: Any, default_output: str) -> Expected:
    """Where this job's events may point (``job``: a Job row, or a plain row with its columns;
    ``default_output``: the output URI a launch gives it when the job does not name one)."""
    overrides = getattr(job, "plan", None) or {}
    push = overrides.get("push_to_hub") if isinstance(overrides, dict) else None
    hub = (ctx.settings.hf_endpoint or "https://huggingface.co").rstrip("/")
    return Expected(
        output_prefix=(overrides.get("output_uri") if isinstance(overrides, dict) else None)
        or default_output,
        checkpoint_prefix=job.checkpoint_uri,
        hub_repo=push.get("repo") if isinstance(push, dict) else None,
        hub_base=hub,
    )


# ---- telling people ----------------------------------------------------------------------------------


def report_refused(ctx: EngineContext, job_id: str, refused: Counter[str]) -> None:
    """Tell the job's thread, once per job (across restarts and replicas: an audit row), that runner data
    was refused and why; log every time."""
    if not refused:
        return  # (most calls: nothing was refused)
    refused = Counter({k: n for k, n in refused.items() if n})
    if not refused:
        return
    what = "; ".join(f"{n} {REASONS.get(k, k)}" for k, n in sorted(refused.items()))
    log.warning("job %s: runner data refused: %s", job_id, what)
    if job_id in ctx.memory.integrity_reported:
        return
    ctx.memory.integrity_reported.add(job_id)
    from sqlalchemy import select

    from bot.engine.events import EngineEventKind
    from bot.engine.record import states as S
    from store.models import AuditLog

    with ctx.session() as s:
        told = s.execute(
            select(AuditLog.id).where(AuditLog.job_id == job_id, AuditLog.action == "runner-data-refused")
        ).first()
        if told is not None:
            return
        S.audit(
            s,
            actor="engine",
            action="runner-data-refused",
            job_id=job_id,
            at=ctx.now(),
            refused=dict(refused),
        )
        s.commit()
    ctx.publish(
        EngineEventKind.warning,
        job_id,
        f"Job {job_id}: ignored runner data: {what}. The job goes on with what its own runner reported.",
        refused=dict(refused),
    )
