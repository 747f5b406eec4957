"""A runner's storage credentials reach its own folder and inputs, nothing else, and expire (issue 19).

Against moto with authentication on and session policies enforced as AWS does (fakes/moto_sts.py), and the
fake of Cloudflare's R2 temporary-credentials endpoint (fakes/cloudflare.py), whose credentials are minted
with the same enforcement.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fakes.cloudflare import FakeCloudflare, minted_by
from fakes.moto_sts import StsWorld

from bot.settings import Settings
from bot.storage import credentials
from bot.storage.credentials import CredentialsError, Mode, choose, startup_warning
from bot.storage.scope import scope_for

ACCOUNT = "0123456789abcdef0123456789abcdef"
R2 = f"https://{ACCOUNT}.r2.cloudflarestorage.com"


def settings(**env: Any) -> Settings:
    base = {
        "TUNEBOT_CHECKPOINT_URI": "s3://b/tunebot",
        "AWS_ACCESS_KEY_ID": "AKIAbot",
        "AWS_SECRET_ACCESS_KEY": "s",
    }
    return Settings(**{**base, **env})


@pytest.mark.parametrize(
    ("env", "mode", "warned"),
    [
        ({}, Mode.federation, False),  # AWS, an IAM user's keys
        ({"AWS_ENDPOINT_URL": "https://s3.eu-west-1.amazonaws.com"}, Mode.federation, False),
        ({"TUNEBOT_STORAGE_ROLE_ARN": "arn:aws:iam::1:role/r"}, Mode.assume_role, False),
        ({"AWS_ENDPOINT_URL": R2, "CLOUDFLARE_API_TOKEN": "cf"}, Mode.r2, False),
        ({"AWS_ENDPOINT_URL": R2}, Mode.static, True),  # R2 without a Cloudflare token
        ({"AWS_ENDPOINT_URL": "https://minio.internal:9000"}, Mode.static, True),  # unknown endpoint
        (
            {"AWS_ENDPOINT_URL": "https://minio.internal:9000", "TUNEBOT_STORAGE_CREDENTIALS": "assume-role"},
            Mode.assume_role,
            False,
        ),
        ({"TUNEBOT_STORAGE_CREDENTIALS": "static"}, Mode.static, True),
    ],
)
def test_which_credentials_a_store_gets(env: dict[str, str], mode: Mode, warned: bool) -> None:
    chosen, warning = choose(settings(**env))
    assert chosen is mode
    assert (warning is not None) == warned
    if warned:
        assert "any rented host can read and write every job's data" in warning
        assert startup_warning(settings(**env)) == warning
    assert startup_warning(settings(**{**env, "TUNEBOT_CHECKPOINT_URI": "/var/tunebot"})) is None


def runner_fs(issued: credentials.Issued, world: StsWorld) -> Any:
    """An s3fs filesystem with exactly what the runner got (as its botocore would read the environment)."""
    import s3fs

    env = issued.env
    return s3fs.S3FileSystem(
        key=env["AWS_ACCESS_KEY_ID"],
        secret=env["AWS_SECRET_ACCESS_KEY"],
        token=env.get("AWS_SESSION_TOKEN"),
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": world.server.url, "region_name": "eu-west-1"},
    )


def seed(world: StsWorld) -> None:
    s3 = world.s3()
    for key in (
        "tunebot/inputs/aa/data.jsonl",
        "tunebot/inputs/models/m-1/config.json",
        "tunebot/j2/checkpoints/progress.json",
        "tunebot/j2/inputs-secret.jsonl",
    ):
        s3.put_object(Bucket=world.bucket, Key=key, Body=b"{}")


def denied(fn: Any) -> bool:
    try:
        fn()
    except (PermissionError, OSError) as exc:
        return "denied" in str(exc).lower() or isinstance(exc, PermissionError)
    return False


def check_scoped(fs: Any, b: str) -> None:
    """What job j1's runner does succeeds; what would touch job j2 or the shared inputs is refused."""
    fs.makedirs(f"{b}/tunebot/j1/checkpoints/checkpoint-1", exist_ok=True)  # s3fs asks where the bucket is
    fs.pipe_file(f"{b}/tunebot/j1/checkpoints/progress.json", b"{}")
    fs.pipe_file(f"{b}/tunebot/j1/checkpoints/checkpoint-1/optimizer.pt", b"x")
    assert fs.ls(f"{b}/tunebot/j1/checkpoints", detail=False)
    fs.rm(f"{b}/tunebot/j1/checkpoints/checkpoint-1", recursive=True)
    assert fs.cat(f"{b}/tunebot/inputs/aa/data.jsonl") == b"{}"
    assert fs.cat(f"{b}/tunebot/inputs/models/m-1/config.json") == b"{}"
    assert denied(lambda: fs.cat(f"{b}/tunebot/j2/inputs-secret.jsonl"))  # read another job's data
    assert denied(lambda: fs.pipe_file(f"{b}/tunebot/j2/checkpoints/progress.json", b"forged"))
    assert denied(lambda: fs.pipe_file(f"{b}/tunebot/j2/checkpoints/checkpoint-999999/optimizer.pt", b"x"))
    assert denied(lambda: fs.ls(f"{b}/tunebot/j2", detail=False, refresh=True))
    assert denied(lambda: fs.pipe_file(f"{b}/tunebot/inputs/aa/data.jsonl", b"poisoned"))  # inputs: read only
    assert denied(lambda: fs.rm(f"{b}/tunebot/j2/checkpoints/progress.json"))


def test_assume_role_credentials_reach_the_jobs_folder_and_inputs_only(sts_s3: StsWorld) -> None:
    world = sts_s3
    seed(world)
    cfg = settings(
        TUNEBOT_CHECKPOINT_URI=f"s3://{world.bucket}/tunebot",
        TUNEBOT_STORAGE_ROLE_ARN=world.role_arn,
        **world.env,
    )
    scope = scope_for(
        f"s3://{world.bucket}/tunebot/j1",
        dataset=f"s3://{world.bucket}/tunebot/inputs/aa/data.jsonl",
        base_model=f"s3://{world.bucket}/tunebot/inputs/models/m-1",
    )
    issued = credentials.issue(cfg, scope, name="j1", now=time.time())
    assert issued.mode is Mode.assume_role and issued.scoped
    assert issued.env["AWS_ACCESS_KEY_ID"] != world.key and issued.env["AWS_SESSION_TOKEN"]
    assert world.secret not in issued.env.values()
    assert abs(float(issued.env["TUNEBOT_CREDENTIALS_EXPIRE_AT"]) - (time.time() + 12 * 3600)) < 120
    check_scoped(runner_fs(issued, world), world.bucket)
    assert (
        world.s3().get_object(Bucket=world.bucket, Key="tunebot/j2/checkpoints/progress.json")["Body"].read()
        == b"{}"
    )


def test_credentials_stop_working_when_they_expire(sts_s3: StsWorld) -> None:
    world = sts_s3
    cfg = settings(TUNEBOT_STORAGE_ROLE_ARN=world.role_arn, **world.env)
    issued = credentials.assume_role(
        cfg, scope_for(f"s3://{world.bucket}/tunebot/j1"), name="j1", seconds=3600
    )
    fs = runner_fs(issued, world)
    fs.pipe_file(f"{world.bucket}/tunebot/j1/a", b"1")
    world.server.advance_clock(3600 - 120)  # on the server's clock: two minutes of life left
    fs.pipe_file(f"{world.bucket}/tunebot/j1/b", b"2")
    world.server.advance_clock(240)  # two minutes past the expiry
    assert denied(lambda: fs.pipe_file(f"{world.bucket}/tunebot/j1/c", b"3"))


def test_federation_asks_sts_for_the_job_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    import botocore.session
    from botocore.stub import Stubber

    from bot.storage.scope import policy_json

    client = botocore.session.get_session().create_client(
        "sts", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )
    scope = scope_for("s3://b/tunebot/j1", dataset="s3://b/tunebot/inputs/aa/d.jsonl")
    expires = time.time() + 3600
    from datetime import UTC, datetime

    with Stubber(client) as stub:
        stub.add_response(
            "get_federation_token",
            {
                "Credentials": {
                    "AccessKeyId": "ASIAFEDERATED0001",
                    "SecretAccessKey": "fed-secret",
                    "SessionToken": "fed-token",
                    "Expiration": datetime.fromtimestamp(expires, UTC),
                }
            },
            {"Name": "tunebot-j1", "Policy": policy_json(scope), "DurationSeconds": 3600},
        )
        monkeypatch.setattr(credentials, "_sts", lambda _settings: client)
        issued = credentials.issue(
            settings(TUNEBOT_STORAGE_CREDENTIALS_SECONDS=3600), scope, name="j1", now=time.time()
        )
    assert issued.mode is Mode.federation
    assert issued.env["AWS_SESSION_TOKEN"] == "fed-token" and abs(issued.expires_at - expires) < 1


def test_r2_temporary_credentials(sts_s3: StsWorld) -> None:
    world = sts_s3
    seed(world)
    with FakeCloudflare(token="cf-token-123456", account=ACCOUNT, mint=minted_by(world)) as cf:
        cfg = settings(
            AWS_ENDPOINT_URL=R2,
            CLOUDFLARE_API_TOKEN="cf-token-123456",
            CLOUDFLARE_API_URL=cf.url,
            AWS_ACCESS_KEY_ID=world.key,
            AWS_SECRET_ACCESS_KEY=world.secret,
            TUNEBOT_STORAGE_CREDENTIALS_SECONDS=3600,
        )
        scope = scope_for(
            f"s3://{world.bucket}/tunebot/j1", dataset=f"s3://{world.bucket}/tunebot/inputs/aa/data.jsonl"
        )
        issued = credentials.issue(cfg, scope, name="j1", now=1000.0)
        assert issued.mode is Mode.r2 and issued.expires_at == 4600.0
        (asked,) = cf.requests
        assert asked == {
            "bucket": world.bucket,
            "parentAccessKeyId": world.key,
            "permission": "object-read-write",
            "ttlSeconds": 3600,
            "prefixes": ["tunebot/j1/"],
            "objects": ["tunebot/inputs/aa/data.jsonl"],
        }
        fs = runner_fs(issued, world)
        fs.pipe_file(f"{world.bucket}/tunebot/j1/checkpoints/progress.json", b"{}")
        assert fs.cat(f"{world.bucket}/tunebot/inputs/aa/data.jsonl") == b"{}"
        assert denied(lambda: fs.pipe_file(f"{world.bucket}/tunebot/j2/checkpoints/progress.json", b"forged"))
        assert denied(lambda: fs.cat(f"{world.bucket}/tunebot/j2/inputs-secret.jsonl"))
        # A refusal is a clear error without the token.
        bad = cfg.model_copy(
            update={"cloudflare_api_token": type(cfg.cloudflare_api_token)("wrong-token-999")}
        )
        with pytest.raises(CredentialsError, match="HTTP 401") as refused:
            credentials.issue(bad, scope, name="j1", now=1000.0)
        assert "wrong-token-999" not in str(refused.value) and "cf-token" not in str(refused.value)
