"""Each launch gets credentials made for its job; the bot renews them at half-life; an unscoped store is
said at every launch (issue 19, item 1). Against moto with session policies and expiry enforced."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fakes.moto_sts import StsWorld
from fakes.snapshot_plan import snapshot_plan as plan_estimate

from bot.engine.launching import offers as offers_mod
from bot.planner.request import EstimateRequest
from bot.settings import Settings
from runner.contract.spec import JobSpec
from runner.credentials import read_renewal

ROWS = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(20)]


def engine_for(tmp_path: Path, world: StsWorld, clock: Any = time.time, **env: Any) -> tuple[Any, Any]:
    from engine.fakes import FakeProvider

    from bot.engine.service import Engine

    cloud = FakeProvider("vast", kind="container")
    settings = Settings(
        TUNEBOT_DATA_DIR=str(tmp_path / "data"),
        TUNEBOT_CHECKPOINT_URI=f"s3://{world.bucket}/tunebot",
        TUNEBOT_STORAGE_ROLE_ARN=world.role_arn,
        **{**world.env, **env},
    )
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    return Engine(settings, db_url=db_url, providers={"vast": cloud}, clock=clock), cloud


def launch(eng: Any, cloud: Any, tmp_path: Path) -> tuple[str, dict[str, str]]:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    est = offers_mod.for_this_engine(plan_estimate(req, offers=[cloud.offer()]), eng.providers, [])
    job = eng.create_job(req, user="alice", estimate=est)
    assert job.state == "running", job.message
    return job.job_id, cloud.launch_requests[-1].env


def test_a_launch_gets_scoped_credentials_and_the_bot_renews_them(tmp_path: Path, sts_s3: StsWorld) -> None:
    world = sts_s3
    ahead = [0.0]  # the bot's and the store's clocks move together, by hand: no lifetime is waited out

    def move(seconds: float) -> None:
        ahead[0] += seconds
        world.server.advance_clock(seconds)

    eng, cloud = engine_for(
        tmp_path, world, clock=lambda: time.time() + ahead[0], TUNEBOT_STORAGE_CREDENTIALS_SECONDS="60"
    )
    job_id, env = launch(eng, cloud, tmp_path)
    spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
    assert (
        env["AWS_ACCESS_KEY_ID"] != world.key
        and world.secret not in env.values()
        and env["AWS_SESSION_TOKEN"]
    )
    # Left in the run's own folder (issue 28): another run's credentials never reach it.
    assert env["TUNEBOT_CREDENTIALS_URI"] == (
        f"s3://{world.bucket}/tunebot/{job_id}/runs/{spec.run_id}/credentials.json"
    )
    import s3fs

    def fs_of(e: dict[str, str]) -> Any:
        return s3fs.S3FileSystem(
            key=e["AWS_ACCESS_KEY_ID"],
            secret=e["AWS_SECRET_ACCESS_KEY"],
            token=e["AWS_SESSION_TOKEN"],
            skip_instance_cache=True,
            client_kwargs={"endpoint_url": world.server.url, "region_name": "eu-west-1"},
        )

    runner = fs_of(env)
    assert runner.cat(spec.dataset.uri.removeprefix("s3://"))  # its staged input
    runner.pipe_file(spec.checkpoint.uri.removeprefix("s3://") + "/progress.json", b"{}")
    eng.tick()  # not yet at half-life: nothing written
    uri = env["TUNEBOT_CREDENTIALS_URI"]
    assert not runner.exists(uri.removeprefix("s3://"))
    move(30 + 1)  # past half-life
    eng.tick()
    found = read_renewal(
        uri, bytes.fromhex(env["TUNEBOT_JOB_KEY"]), job_id, spec.run_id
    )  # read with the runner's own keys
    assert found is not None, "no renewed credentials"
    fresh, expires = found
    assert (
        expires > float(env["TUNEBOT_CREDENTIALS_EXPIRE_AT"])
        and fresh["AWS_ACCESS_KEY_ID"] != env["AWS_ACCESS_KEY_ID"]
    )
    move(30)  # the first credentials have expired; the renewed ones work, for this job only
    try:
        runner.pipe_file(spec.checkpoint.uri.removeprefix("s3://") + "/progress.json", b"{}")
        raise AssertionError("expired credentials still work")
    except PermissionError:
        pass
    renewed = fs_of({**env, **fresh})
    renewed.pipe_file(spec.checkpoint.uri.removeprefix("s3://") + "/progress.json", b"{}")
    other = f"{world.bucket}/tunebot/someone-else/progress.json"
    try:
        renewed.pipe_file(other, b"forged")
        raise AssertionError("renewed credentials reached another job's folder")
    except PermissionError:
        pass
    eng.close()


def test_an_unscoped_store_is_said_at_every_launch(tmp_path: Path, sts_s3: StsWorld) -> None:
    from bot.engine.events import EngineEventKind

    eng, cloud = engine_for(tmp_path, sts_s3, TUNEBOT_STORAGE_CREDENTIALS="static")
    seen: list[Any] = []
    eng.bus.subscribe(seen.append)
    _, env = launch(eng, cloud, tmp_path)
    assert env["AWS_ACCESS_KEY_ID"] == sts_s3.key and "TUNEBOT_CREDENTIALS_URI" not in env
    (started,) = [e for e in seen if e.kind == EngineEventKind.job_started]
    assert "Storage is not scoped per job" in started.message
    eng.close()
