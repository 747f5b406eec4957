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
- downloads every file it lists and checks its size and SHA-256 (a file a former host swapped afterwards,
  or one not listed, never goes up);
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
from typing import TYPE_CHECKING

from sqlalchemy import update

from store.models import Job

if TYPE_CHECKING:
    from bot.engine.context import EngineContext

log = logging.getLogger(__name__)

PUSHING, PUSHED, FAILED = "pushing", "pushed", "failed"
STALE_S = 1800.0  # a push claimed this long ago by a process that never recorded it is taken again


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
        verified_output(run.output_uri, job.id, run.output_manifest_sha256, key, folder)
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


def verified_output(uri: str, job_id: str, pinned: str, key: bytes | None, into: Path) -> None:
    """Download the output at ``uri`` into ``into``: only the files its manifest lists, the manifest's bytes
    hashing to ``pinned`` and signed with ``key`` (its run's), each file's size and SHA-256 checked.
    NotPushed says what did not match."""
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
        for name, entry in entries.items():
            remote = f"{root}/{name}"
            if fs.size(remote) != entry.size:
                raise ManifestError(f"{name} does not have the size its manifest says")
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(target))
        verify_files(into, entries)
    except ManifestError as exc:
        raise NotPushed(f"the output does not match what its run signed: {exc}") from None
    except (OSError, ValueError) as exc:
        raise NotPushed(f"the output could not be read ({type(exc).__name__})") from None
