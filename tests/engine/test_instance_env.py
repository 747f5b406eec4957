"""A runner gets only what its job needs, and nothing it got shows up in a message (issue 19, item 3).

Attacks reported on a9605e4: runners got HF_TOKEN and WANDB_API_KEY when the job used neither; a provider
error that echoed the create request put the runner's storage keys into the job's message (only the cloud
key was redacted); the local provider passed the bot's whole environment minus a deny list, so
PGPASSWORD, SLACK_CLIENT_SECRET and other clouds' keys reached the runner.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from fakes.clouds import FakeVast
from fakes.clouds.fixtures import client_for
from fakes.snapshot_plan import snapshot_plan as plan_estimate

from bot.engine.launching import offers as offers_mod
from bot.planner.request import EstimateRequest
from bot.settings import Settings
from runner.contract.spec import JobSpec

from .conftest import Recorder
from .fakes import FakeProvider

HF = "hf_secret_token_issue19_aa11"
WANDB = "wandb-secret-key-issue19-bb22"
CHAT = [
    {
        "messages": [
            {"role": "user", "content": f"add {i} and {i}"},
            {"role": "assistant", "content": f"{2 * i}"},
        ]
    }
    for i in range(30)
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny")).parent


def engine_on(tmp_path: Path, provider: Any, **env: Any) -> Any:
    from bot.engine.service import Engine

    settings = Settings(
        TUNEBOT_DATA_DIR=str(tmp_path / "data"),
        HF_TOKEN=HF,
        WANDB_API_KEY=WANDB,
        TUNEBOT_HUB_NAMESPACES="acme",
        **env,
    )
    return Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={provider.name: provider})


def planned(eng: Any, req: EstimateRequest) -> Any:
    from bot.providers.base import OfferQuery

    offers = [o for p in eng.providers.values() for o in p.search_offers(OfferQuery())]
    return offers_mod.for_this_engine(plan_estimate(req, offers=offers), eng.providers, [])


def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    return path


def test_a_job_using_neither_the_hub_nor_wandb_gets_neither_key(
    tmp_path: Path, tiny: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the suite logs offline; here W&B is online with a key
    cloud = FakeProvider("vast", kind="container")
    eng = engine_on(tmp_path, cloud, TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot")
    req = EstimateRequest(model=str(tiny / "model"), dataset=str(dataset(tmp_path)))
    no_wandb = {"wandb": {"mode": "disabled"}}
    eng.create_job(req, user="alice", estimate=planned(eng, req), spec_overrides=no_wandb)
    env = cloud.launch_requests[-1].env
    assert "HF_TOKEN" not in env and "WANDB_API_KEY" not in env, sorted(env)
    # A job that pushes gets no Hub token at all (issue 28: the bot pushes); one that logs to W&B online gets
    # the W&B key.
    pushing = req.model_copy(update={"push_to_hub": "acme/tiny-lora"})
    eng.create_job(pushing, user="alice", estimate=planned(eng, pushing))
    env = cloud.launch_requests[-1].env
    spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
    assert "HF_TOKEN" not in env and HF not in env.values()
    assert spec.wandb.mode == "online" and env["WANDB_API_KEY"] == WANDB
    assert HF not in env["TUNEBOT_JOB_SPEC"] and WANDB not in env["TUNEBOT_JOB_SPEC"]
    eng.close()


def test_the_read_token_goes_only_for_a_model_the_hub_does_not_serve_to_anyone() -> None:
    from bot.engine.launching.instance_env import needs_hf_token

    def spec(model: str, push: str | None = None) -> JobSpec:
        return JobSpec.model_validate(
            {
                "job_id": "j1",
                "base_model": model,
                "dataset": {"uri": "s3://b/d.jsonl"},
                "checkpoint": {"uri": "s3://b/j1/c"},
                "output_uri": "s3://b/j1/o",
                "push_to_hub": {"repo": push} if push else None,
            }
        )

    access = {"meta-llama/Llama-3.1-8B": "restricted", "Qwen/Qwen2.5-0.5B": "public", "acme/new": "unknown"}
    assert not needs_hf_token(spec("Qwen/Qwen2.5-0.5B"), access.__getitem__)
    assert needs_hf_token(spec("meta-llama/Llama-3.1-8B"), access.__getitem__)
    assert needs_hf_token(spec("acme/new"), access.__getitem__)  # the Hub could not say: gated ones must work
    assert not needs_hf_token(
        spec("Qwen/Qwen2.5-0.5B", push="acme/out"), access.__getitem__
    )  # the bot pushes
    for path in ("s3://b/inputs/models/m-1", "/models/llama", "./m"):
        assert not needs_hf_token(spec(path), lambda m: pytest.fail(f"asked the Hub about {m}"))


def test_a_provider_error_echoing_the_request_puts_no_runner_secret_in_messages(
    tmp_path: Path, tiny: Path, s3_bucket: str
) -> None:
    vast = FakeVast(n_offers=40, seed=3).start()
    try:
        eng = engine_on(
            tmp_path,
            client_for(vast),
            TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot",
            TUNEBOT_MIN_RELIABILITY=0.0,
        )
        rec = Recorder(eng.bus)
        vast.inject("echo", times=1000)  # every offer refuses it
        req = EstimateRequest(
            model=str(tiny / "model"), dataset=str(dataset(tmp_path)), push_to_hub="acme/tiny-lora"
        )
        job = eng.create_job(req, user="alice", estimate=planned(eng, req), max_cost=5.0)
        creates = [b for op, b in vast.bodies if op == "create"]
        assert creates, "no create was sent"
        env = creates[0]["env"]
        sent = [
            v
            for k, v in env.items()
            if k not in ("TUNEBOT_JOB_SPEC", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "HF_ENDPOINT")
        ]
        sent.append(JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"]).report.token)
        assert any(len(v) > 8 for v in sent)
        view = eng.get_job(job.job_id)
        assert "invalid env" in (view.message or ""), view.message  # the provider's words are kept...
        told = json.dumps([view.model_dump(mode="json"), [e.model_dump(mode="json") for e in rec.events]])
        for value in sent:  # ... without the values, whole or cut short by an excerpt
            assert value not in told and value[:12] not in told, f"{value[:6]}... leaked into a message"
        eng.close()
    finally:
        vast.stop()


ENV_PRINTER = textwrap.dedent(
    """
    import json, os
    print("ENV " + json.dumps(sorted(os.environ)), flush=True)
    """
)


def test_the_local_runner_inherits_an_allow_list_not_the_bots_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.providers.base import InstanceStatus, LaunchRequest
    from bot.providers.local import LocalProvider

    bot_only = {
        "PGPASSWORD": "pg-secret-1",
        "SLACK_CLIENT_SECRET": "slack-client-2",
        "RUNPOD_API_KEY": "runpod-3",
        "AWS_SECRET_ACCESS_KEY": "bot-aws-4",
        "TUNEBOT_SECRET_KEY": "m-5",
        "GITHUB_TOKEN": "gh-6",
        "OPENAI_API_KEY": "oa-7",
    }
    for key, value in bot_only.items():
        monkeypatch.setenv(key, value)
    local = LocalProvider(workdir=tmp_path / "work", runner_command=[sys.executable, "-c", ENV_PRINTER])
    inst = local.launch(
        LaunchRequest(
            job_id="j1", offer=local.offer(), image="x", env={"TUNEBOT_JOB_SPEC": "{}", "HF_TOKEN": "given"}
        )
    )
    deadline = time.monotonic() + 20
    while local.status(inst.instance_id).status != InstanceStatus.exited:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    lines = local.log_path(inst.instance_id).read_text().splitlines()
    line = next(ln for ln in lines if ln.startswith("ENV "))
    seen = set(json.loads(line[4:]))
    assert not seen & set(bot_only), seen & set(bot_only)
    assert {"PATH", "TUNEBOT_JOB_SPEC", "HF_TOKEN"} <= seen  # what it needs, and what the launch gave it
