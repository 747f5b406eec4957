"""What one run's runner may touch in object storage, and the session policy that says so (pure).

A run (one launch of a job: bot/engine/record/runs.py) reads and writes under its own folder
(``<TUNEBOT_CHECKPOINT_URI>/<job id>/runs/<run id>/``: checkpoints, progress, output, its renewed
credentials) and only reads its inputs (the dataset object, the base model's folder when it is in storage)
and the checkpoints of earlier runs it resumes from. Nothing else - another job's folder, another run of the
same job, the staged inputs of other jobs, the rest of the bucket - is reachable with the credentials made
from this scope (bot/storage/credentials.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

READ_WRITE = [
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
]


@dataclass(frozen=True)
class Read:
    """An input the job reads: one object, or every object under a folder (``folder``)."""

    bucket: str
    key: str
    folder: bool = False


@dataclass(frozen=True)
class Scope:
    bucket: str
    prefix: str  # the run's own folder as a key prefix ending in "/" ("tunebot/<job id>/runs/<run id>/")
    reads: tuple[Read, ...] = field(default_factory=tuple)

    def buckets(self) -> list[str]:
        return sorted({self.bucket, *(r.bucket for r in self.reads)})


def split_s3(uri: str) -> tuple[str, str] | None:
    """(bucket, key) of an s3:// URI; None for anything else."""
    if not uri.startswith("s3://"):
        return None
    rest = uri[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket or ".." in key.split("/"):
        return None
    return bucket, key.strip("/")


def scope_for(
    job_root: str,
    *,
    dataset: str | None = None,
    base_model: str | None = None,
    resume: Iterable[str] = (),
) -> Scope | None:
    """The scope of a run whose folder is ``job_root`` (an s3:// URI), reading these inputs where they are
    in s3 (a Hub model id or a local path needs nothing here) and the checkpoint folders in ``resume``. None
    when the folder is not in s3."""
    root = split_s3(job_root)
    if root is None or not root[1]:
        return None
    reads: list[Read] = []
    if dataset and (where := split_s3(dataset)) and where[1]:
        reads.append(Read(where[0], where[1]))
    if base_model and (where := split_s3(base_model)) and where[1]:
        reads.append(Read(where[0], where[1], folder=True))
    for uri in resume:
        if (where := split_s3(uri)) and where[1]:
            reads.append(Read(where[0], where[1], folder=True))
    return Scope(bucket=root[0], prefix=root[1] + "/", reads=tuple(reads))


def _arn(bucket: str, key: str = "") -> str:
    return f"arn:aws:s3:::{bucket}" + (f"/{key}" if key else "")


def session_policy(scope: Scope) -> dict[str, Any]:
    """The IAM session policy (STS AssumeRole / GetFederationToken, MinIO AssumeRole) of a scope.

    - read, write and delete under the run's prefix; list only that prefix;
    - read each input object, read and list each input folder;
    - GetBucketLocation on the buckets (s3fs asks where a bucket is before it writes; it reveals nothing).
    Credentials made with it can do only what both this and the bot's own policy allow."""
    statements: list[dict[str, Any]] = [
        {
            "Sid": "JobFolder",
            "Effect": "Allow",
            "Action": READ_WRITE,
            "Resource": [_arn(scope.bucket, scope.prefix + "*")],
        },
    ]
    objects = [_arn(r.bucket, r.key) for r in scope.reads if not r.folder]
    objects += [_arn(r.bucket, r.key + "/*") for r in scope.reads if r.folder]
    if objects:
        statements.append(
            {"Sid": "Inputs", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": objects}
        )
    listable: dict[str, list[str]] = {scope.bucket: [scope.prefix + "*", scope.prefix.rstrip("/")]}
    for r in scope.reads:
        if r.folder:
            listable.setdefault(r.bucket, []).extend([r.key + "/*", r.key])
    for n, (bucket, prefixes) in enumerate(sorted(listable.items())):
        statements.append(
            {
                "Sid": f"List{n}",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [_arn(bucket)],
                "Condition": {"StringLike": {"s3:prefix": prefixes}},
            }
        )
    statements.append(
        {
            "Sid": "Where",
            "Effect": "Allow",
            "Action": ["s3:GetBucketLocation"],
            "Resource": [_arn(b) for b in scope.buckets()],
        }
    )
    return {"Version": "2012-10-17", "Statement": statements}


def policy_json(scope: Scope) -> str:
    """The session policy as the STS call takes it (compact: its packed size is limited)."""
    return json.dumps(session_policy(scope), separators=(",", ":"))


def r2_request(scope: Scope, *, parent_key_id: str, ttl_seconds: int) -> dict[str, Any]:
    """The body of Cloudflare R2's temporary-credentials call for a scope (one bucket, one permission):
    read-write on the run's prefix and on its input objects and folders, the checkpoints it resumes from
    too (R2 cannot mix read-only and read-write in one credential: tunebot stages R2 inputs per job, so no
    other job reads what this one could change, bot/engine/launching/staging.py; a checkpoint it could rewrite
    is loaded only as its pinned manifest digest says, runner/contract/manifest.py)."""
    if any(r.bucket != scope.bucket for r in scope.reads):
        raise ValueError("R2 temporary credentials cover one bucket: the inputs must be in the job's bucket")
    return {
        "bucket": scope.bucket,
        "parentAccessKeyId": parent_key_id,
        "permission": "object-read-write",
        "ttlSeconds": ttl_seconds,
        "prefixes": [scope.prefix, *(r.key + "/" for r in scope.reads if r.folder)],
        "objects": [r.key for r in scope.reads if not r.folder],
    }
