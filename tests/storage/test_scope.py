"""The scope of one job and the session policy built from it (pure)."""

from __future__ import annotations

import json

import pytest

from bot.storage.scope import Read, Scope, policy_json, r2_request, scope_for, session_policy


def test_a_jobs_scope_is_its_folder_and_its_inputs() -> None:
    scope = scope_for(
        "s3://b/tunebot/j1",
        dataset="s3://b/tunebot/inputs/0af3/data.jsonl",
        base_model="s3://models/tunebot/inputs/models/tiny-12ab",
    )
    assert scope == Scope(
        bucket="b",
        prefix="tunebot/j1/",
        reads=(
            Read("b", "tunebot/inputs/0af3/data.jsonl"),
            Read("models", "tunebot/inputs/models/tiny-12ab", folder=True),
        ),
    )
    # A Hub model and a local dataset need nothing from storage; a job folder outside s3 has no scope.
    assert scope_for("s3://b/t/j1", dataset="/data/x.jsonl", base_model="meta-llama/Llama-3.1-8B").reads == ()
    assert scope_for("/var/lib/tunebot/jobs/j1") is None
    assert scope_for("gs://b/t/j1") is None
    assert scope_for("s3://b/t/j1", dataset="s3://b/t/../j2/x").reads == ()


def test_the_session_policy_grants_the_job_folder_and_reads_of_its_inputs_only() -> None:
    scope = scope_for(
        "s3://b/tunebot/j1",
        dataset="s3://b/tunebot/inputs/0af3/data.jsonl",
        base_model="s3://b/tunebot/inputs/models/tiny-12ab",
    )
    policy = session_policy(scope)
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["JobFolder"]["Resource"] == ["arn:aws:s3:::b/tunebot/j1/*"]
    assert {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"} <= set(by_sid["JobFolder"]["Action"])
    assert by_sid["Inputs"] == {
        "Sid": "Inputs",
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": [
            "arn:aws:s3:::b/tunebot/inputs/0af3/data.jsonl",
            "arn:aws:s3:::b/tunebot/inputs/models/tiny-12ab/*",
        ],
    }
    (listing,) = [s for s in policy["Statement"] if s["Action"] == ["s3:ListBucket"]]
    assert listing["Resource"] == ["arn:aws:s3:::b"]
    model = "tunebot/inputs/models/tiny-12ab"
    prefixes = ["tunebot/j1/*", "tunebot/j1", model + "/*", model]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": prefixes}}
    # Nothing grants a whole bucket, a write outside the job's folder, or any other action.
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        for res in st["Resource"]:
            assert res in ("arn:aws:s3:::b",) or res.startswith(
                ("arn:aws:s3:::b/tunebot/j1/", "arn:aws:s3:::b/tunebot/inputs/")
            )
        writes = {"s3:PutObject", "s3:DeleteObject"} & set(st["Action"])
        assert not writes or st["Resource"] == ["arn:aws:s3:::b/tunebot/j1/*"]
        if st["Resource"] == ["arn:aws:s3:::b"]:
            assert st["Action"] == ["s3:GetBucketLocation"] or "Condition" in st
    assert len(policy_json(scope)) < 2048  # GetFederationToken's (and moto's) limit on the policy text
    assert json.loads(policy_json(scope)) == policy


def test_r2_temporary_credentials_cover_the_job_prefix_and_its_inputs() -> None:
    scope = scope_for(
        "s3://b/tunebot/j1",
        dataset="s3://b/tunebot/inputs/private-1/data.jsonl",
        base_model="s3://b/tunebot/inputs/private-2/model",
    )
    assert r2_request(scope, parent_key_id="AKIA123", ttl_seconds=3600) == {
        "bucket": "b",
        "parentAccessKeyId": "AKIA123",
        "permission": "object-read-write",
        "ttlSeconds": 3600,
        "prefixes": ["tunebot/j1/", "tunebot/inputs/private-2/model/"],
        "objects": ["tunebot/inputs/private-1/data.jsonl"],
    }
    with pytest.raises(ValueError, match="one bucket"):
        r2_request(scope_for("s3://b/t/j1", dataset="s3://other/d.jsonl"), parent_key_id="k", ttl_seconds=60)


def test_a_runs_scope_reads_the_checkpoints_it_resumes_from_and_nothing_else_of_its_job() -> None:
    """Issue 28: a run writes only its own folder; it reads the earlier runs' checkpoints it resumes from."""
    old = "s3://b/tunebot/j1/runs/r1-aa/checkpoints/checkpoint-40"
    scope = scope_for("s3://b/tunebot/j1/runs/r2-bb", resume=[old, "/local/ckpt", "s3://b/x/../y"])
    assert scope is not None and scope.prefix == "tunebot/j1/runs/r2-bb/"
    assert scope.reads == (Read("b", "tunebot/j1/runs/r1-aa/checkpoints/checkpoint-40", folder=True),)
    by_sid = {s["Sid"]: s for s in session_policy(scope)["Statement"]}
    assert by_sid["JobFolder"]["Resource"] == ["arn:aws:s3:::b/tunebot/j1/runs/r2-bb/*"]
    assert by_sid["Inputs"] == {
        "Sid": "Inputs",
        "Effect": "Allow",
        "Action": ["s3:GetObject"],  # read only: the run cannot change what it resumes from
        "Resource": ["arn:aws:s3:::b/tunebot/j1/runs/r1-aa/checkpoints/checkpoint-40/*"],
    }
    assert "tunebot/j1/*" not in json.dumps(session_policy(scope))  # never the whole job folder
