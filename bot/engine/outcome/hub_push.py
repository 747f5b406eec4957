"""The Hub push, done by the bot: a host never holds a token that can write to the Hub.

The Hub offers no short-lived scoped token a host could be given, and whatever a host gets stays disclosed to
its owner (../shared/docs/security.md). So the runner only writes its output folder and a manifest of it
(file names, sizes, SHA-256, signed with its run's key: runner/contract/manifest.py), and its terminal event
carries that manifest's digest; the bot records it from the current run's signed event
(bot/engine/record/runs.py). When the job finishes (finished, or stopped on a plateau), before its final state
is recorded, ``push`` here:

- re-checks the repo against the policy (TUNEBOT_HUB_NAMESPACES; a public repo needs admins: the approval
  itself was an admin's, bot/engine/control/jobs.py);
- reads the output's manifest from storage with the bot's own credentials, and accepts it only when its
  bytes hash to the digest the run reported and the run's key signed it;
- refuses, before a byte of it is downloaded, an output larger than the job can produce (``output_limit``:
  the weights the planner counts for its model and method, with room, plus the small files) or than the
  bot's disk can take while keeping KEEP_FREE_BYTES free: the host's manifest is its own claim, and the
  disk the bot downloads to may hold its database;
- downloads every file it lists, never more bytes than the manifest says, and checks its size and SHA-256
  (a file a former host swapped afterwards, or one not listed, never goes up);
- pushes with the bot's HF_TOKEN through runner/contract/publish.py ``push_folder``: only into a repo this job
  creates (or created before: its marker), the job's files in their public form.

The outcome is recorded on the job (``hub_state``, ``hub_url``) and in its message ("Pushed to the Hub:
URL", or why not): a push that failed never fails the job (its output stays in storage).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from store.models import Job

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)

PUSHING, PUSHED, FAILED = "pushing", "pushed", "failed"
STALE_S = 1800.0  # a push claimed this long ago by a process that never recorded it is taken again
# What a job's output may take (issue 38: a tiny LoRA job's host listed a 512 MB "adapter" and the bot fetched
# it): its weights at 4 bytes a parameter (adapters are fp32; a full fine-tune on the CPU and a merged model
# may be too) with this much room, plus the small files (tokenizer, configs, model card, job.json: a Llama 3
# tokenizer is 9 MB).
WEIGHTS_MARGIN = 0.25
OTHER_FILES_BYTES = 64 * 1024**2
KEEP_FREE_BYTES = (
    2 * 1024**3
)  # the bot's disk keeps this much free after a download (its database lives there)


class NotPushed(Exception):
    """Why the output was not pushed (a sentence for the job's thread, without secrets)."""


def push(ctx: EngineContext, job_id: str) -> bool:
    """Push the job's verified output to its Hub repo, once (its outcome goes to the job's message). True
    when there is nothing more to do (pushed now or before, failed with its reason, nothing to push); False
    while another process or thread pushes it: the caller's finish waits for the next tick, so that the job
    is final only once its push is told."""
    with ctx.session() as s:
        job = s.get(Job, job_id)
    if job is None:
        return True
    hub = (job.plan or {}).get("push_to_hub")
    if not isinstance(hub, dict) or not hub.get("repo") or job.hub_state in (PUSHED, FAILED):
        return True
    if not _claim(ctx, job_id):
        return False
    repo = str(hub["repo"])
    try:
        url = _push(ctx, job, repo, private=hub.get("private", True) is not False)
    except NotPushed as exc:
        note = f"not pushed to the Hub ({exc})"[:500]
        _record(ctx, job_id, FAILED, None, note)
        log.warning("job %s: %s", job_id, note)
        return True
    except Exception as exc:  # noqa: BLE001 - unexpected: released, tried again by the next finish
        log.exception("job %s: Hub push failed", job_id)
        _release(ctx, job_id)
        raise exc
    _record(ctx, job_id, PUSHED, url, f"Pushed to the Hub: {url}")
    return True


def _claim(ctx: EngineContext, job_id: str) -> bool:
    """Take the push (one process, one thread at a time); False when another holds a fresh claim."""
    from sqlalchemy import or_

    now = ctx.now()
    with ctx.session() as s:
        res = s.execute(
            update(Job)
            .where(
                Job.id == job_id,
                or_(
                    Job.hub_state.is_(None),
                    (Job.hub_state == PUSHING) & (Job.hub_claimed_at < now - STALE_S),
                ),
            )
            .values(hub_state=PUSHING, hub_claimed_at=now)
        )
        s.commit()
        return res.rowcount == 1


def _release(ctx: EngineContext, job_id: str) -> None:
    with ctx.session() as s:
        s.execute(update(Job).where(Job.id == job_id, Job.hub_state == PUSHING).values(hub_state=None))
        s.commit()


def _record(ctx: EngineContext, job_id: str, state: str, url: str | None, note: str) -> None:
    with ctx.session() as s:
        job = s.get(Job, job_id)
        message = "; ".join(m for m in ((job.message if job else None), note) if m)[:1000]
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(hub_state=state, hub_url=url, hub_claimed_at=ctx.now(), message=message)
        )
        s.commit()


def _push(ctx: EngineContext, job: Job, repo: str, *, private: bool) -> str:
    from bot.engine.launching import integrity
    from bot.engine.launching.launch import build_spec
    from bot.engine.record import runs
    from bot.providers.base import redact
    from runner.contract.publish import PushRefused, push_folder
    from runner.contract.spec import HubSpec

    settings = ctx.settings
    allowed = ctx.policy.can_push_to_hub(job.owner, repo, public=not private)
    if not allowed:
        raise NotPushed(allowed.reason)
    token = settings.hf_token.get_secret_value() if settings.hf_token is not None else None
    if not token:
        raise NotPushed("HF_TOKEN is not set for the bot")
    run = runs.reported_output(ctx, job.id)
    if run is None or not run.output_uri or not run.output_manifest_sha256:
        raise NotPushed("no output signed by the job's run was reported")
    key = integrity.run_key(ctx, job.id, run.id)
    folder = Path(tempfile.mkdtemp(prefix="tunebot-push-"))
    try:
        verified_output(
            run.output_uri, job.id, run.output_manifest_sha256, key, folder, limit=output_limit(job)
        )
        spec = build_spec(ctx, job, job.offer, None, run)
        try:
            return push_folder(
                folder,
                HubSpec(repo=repo, private=private),
                spec,
                message=f"tunebot job {job.id}: {job.outcome or 'finished'}",
                token=token,
                endpoint=settings.hf_endpoint,
            )
        except PushRefused as exc:
            raise NotPushed(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the Hub's refusal or trouble, said in the thread
            raise NotPushed(redact(f"{type(exc).__name__}: {exc}", settings.secrets())[:300]) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def output_limit(job: Job) -> tuple[int, str]:
    """The most bytes the job's output can take, and what that is (for the refusal): its weights as the
    planner counts them for its model, method and merge (``WEIGHTS_MARGIN`` over 4 bytes a parameter) plus
    OTHER_FILES_BYTES; from the disk the job was sized for (``Job.disk_gb``) when the model cannot be read."""
    from bot.planner.memory import trainable_parameters
    from bot.planner.models import resolve
    from bot.planner.request import EstimateRequest

    plan = job.plan or {}
    try:
        request = EstimateRequest.model_validate(job.request)
        arch, _ = resolve(request.model)
        weights = trainable_parameters(arch, request)
        what = f"{weights:,} trained parameters"
        if plan.get("merge") and request.method != "full":
            weights += arch.parameters
            what += f" and the merged model's {arch.parameters:,}"
    except Exception:  # noqa: BLE001 - an unreadable config: the disk the job was sized for bounds it
        gb = float(job.disk_gb or 100.0)
        return int(gb * 1e9), f"the {gb:g} GB disk the job was sized for"
    limit = int(weights * 4 * (1 + WEIGHTS_MARGIN)) + OTHER_FILES_BYTES
    return (
        limit,
        f"{what} at 4 bytes, {WEIGHTS_MARGIN:.0%} room, {_size(OTHER_FILES_BYTES)} of other files",
    )


def download_refusal(total: int, limit: tuple[int, str] | None, free: int) -> str | None:
    """Why an output of ``total`` bytes is not downloaded: more than the job can produce (``limit``) or than
    the disk can take keeping KEEP_FREE_BYTES free; None when it may be (pure)."""
    if limit is not None and total > limit[0]:
        return (
            f"the output lists {_size(total)}, more than this job can produce (at most {_size(limit[0])}: "
            f"{limit[1]}); nothing was downloaded"
        )
    if total > free - KEEP_FREE_BYTES:
        return (
            f"the output lists {_size(total)} and the bot's disk has {_size(free)} free (it keeps "
            f"{_size(KEEP_FREE_BYTES)} free); nothing was downloaded"
        )
    return None


def _size(n: int) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"


def verified_output(
    uri: str,
    job_id: str,
    pinned: str,
    key: bytes | None,
    into: Path,
    *,
    limit: tuple[int, str] | None = None,
) -> None:
    """Download the output at ``uri`` into ``into``: only the files its manifest lists, the manifest's bytes
    hashing to ``pinned`` and signed with ``key`` (its run's), their total within ``limit`` (bytes, what
    that is) and the free space of ``into``'s disk before a byte is fetched, each file no longer than its
    manifest says as it is copied, then its size and SHA-256 checked. NotPushed says what did not match."""
    import fsspec

    from runner.contract.manifest import (
        MAX_MANIFEST_BYTES,
        OUTPUT_MANIFEST,
        ManifestError,
        check_output,
        verify_files,
    )

    try:
        fs, root = fsspec.core.url_to_fs(uri.rstrip("/"))
        root = root.rstrip("/")
        with fs.open(f"{root}/{OUTPUT_MANIFEST}", "rb") as fh:
            raw = fh.read(4 * MAX_MANIFEST_BYTES + 1)
        entries = check_output(raw, job_id=job_id, pinned=pinned, key=key)
        refused = download_refusal(sum(e.size for e in entries.values()), limit, shutil.disk_usage(into).free)
        if refused:
            raise NotPushed(refused)
        for name, entry in entries.items():
            remote = f"{root}/{name}"
            if fs.size(remote) != entry.size:
                raise ManifestError(f"{name} does not have the size its manifest says")
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_at_most(fs, remote, target, entry.size)
        verify_files(into, entries)
    except ManifestError as exc:
        raise NotPushed(f"the output does not match what its run signed: {exc}") from None
    except (OSError, ValueError) as exc:
        raise NotPushed(f"the output could not be read ({type(exc).__name__})") from None


def _copy_at_most(fs: Any, remote: str, target: Path, size: int) -> None:
    """Copy ``remote`` to ``target``, refusing it once it is longer than ``size`` (a file that grew after its
    size was read is never fetched whole)."""
    from runner.contract.manifest import ManifestError

    copied = 0
    with fs.open(remote, "rb") as src, open(target, "wb") as dst:
        while chunk := src.read(min(8 * 1024**2, size - copied + 1)):
            copied += len(chunk)
            if copied > size:
                raise ManifestError(f"{target.name} is longer than its manifest says")
            dst.write(chunk)
