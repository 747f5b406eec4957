"""No host holds a token that can write to the Hub; the bot pushes the verified output (issue 28, part A,
item 2).

Attack reported on eac3cff: for a private push or a gated model the operator's HF_TOKEN was put in the host's
environment, and a host used it to overwrite a repository outside the allowed namespaces. Replayed here the
way that host plays it: with exactly what the provider call carried (the launch request's environment), it
tries every token it got against a fake Hub on 127.0.0.1. Then the job's own runner (played by the test)
writes its output and the manifest it signs, and the bot pushes that output into the allowed repo itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes.hub import FakeHub, HubRepo
from fakes.snapshot_plan import snapshot_plan as plan_estimate
from fakes.worlds import join_finisher

from bot.engine.launching import offers as offers_mod
from bot.planner.request import EstimateRequest
from bot.providers.base import InstanceStatus
from bot.settings import Settings
from runner.contract.spec import JobSpec

from .conftest import Recorder
from .fakes import FakeProvider

WRITE = "hf_team_write_token_28a1"  # the operator's own token: pushes, on the bot's side only
READ = "hf_fine_grained_read_28b2"  # a fine-grained read-only token: the only one a host may get
GATED = "meta-llama/Llama-3.1-8B"
ROWS = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(20)]


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with FakeHub(token=WRITE) as fake:
        fake.repos["victim/prod-model"] = HubRepo(
            "victim/prod-model", private=False, files={"README.md": b"prod"}
        )
        fake.add_model(GATED, gated=True, granted={READ})
        yield fake


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny")).parent


def try_to_write(hub: FakeHub, env: dict[str, str]) -> list[str]:
    """What a host owner does with every value the instance got: use it as a Hub token to overwrite a repo
    outside the allowed namespaces, and to create one inside them. The repos it managed to write."""
    from huggingface_hub import CommitOperationAdd, HfApi

    wrote = []
    for token in sorted({v for v in env.values() if v and len(v) < 200}):
        api = HfApi(endpoint=hub.url, token=token)
        for repo in ("victim/prod-model", "acme/planted"):
            try:
                api.create_repo(repo, exist_ok=True)
                api.create_commit(
                    repo_id=repo,
                    operations=[CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=b"owned")],
                    commit_message="x",
                )
            except Exception:  # noqa: BLE001 - refused, as it must be
                continue
            wrote.append(repo)
    return wrote


def test_a_host_gets_no_hub_write_token_and_the_bot_pushes_the_verified_output(
    tmp_path: Path, tiny: Path, hub: FakeHub
) -> None:
    from bot.engine.service import Engine
    from runner.contract.integrity import EVENT, sign

    fake = FakeProvider("fake", memory_gb=80)  # shares the bot's disk: the job's folder is a local path
    settings = Settings(
        TUNEBOT_DATA_DIR=str(tmp_path / "data"),
        HF_TOKEN=WRITE,
        TUNEBOT_HF_READ_TOKEN=READ,
        HF_ENDPOINT=hub.url,
        TUNEBOT_HUB_NAMESPACES="acme",
    )
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"fake": fake})
    rec = Recorder(eng.bus)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))

    def launch(req: EstimateRequest) -> tuple[str, dict[str, str]]:
        est = offers_mod.for_this_engine(plan_estimate(req, offers=[fake.offer()]), eng.providers, [])
        job = eng.create_job(req, user="alice", estimate=est)
        assert job.state == "running", job.message
        return job.job_id, dict(fake.launch_requests[-1].env)

    pushing, env = launch(
        EstimateRequest(model=str(tiny / "model"), dataset=str(data), push_to_hub="acme/tiny-lora")
    )
    # The host owner of a job that pushes tries everything the provider call carried.
    assert try_to_write(hub, env) == []
    assert hub.repos["victim/prod-model"].files == {"README.md": b"prod"} and "acme/planted" not in hub.repos
    assert "HF_TOKEN" not in env and WRITE not in json.dumps(env)
    # A gated base model: its host gets the read-only token, and nothing it can write with.
    gated, gated_env = launch(EstimateRequest(model=GATED, dataset=str(data), max_steps=5))
    assert gated_env.get("HF_TOKEN") == READ and WRITE not in json.dumps(gated_env)
    assert try_to_write(hub, gated_env) == []
    assert hub.repos["victim/prod-model"].files == {"README.md": b"prod"} and "acme/planted" not in hub.repos
    # The pushing job's runner writes its output and the manifest it signs with its run's key, and says so.
    from runner.contract import manifest

    spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
    out = Path(spec.output_uri)
    out.mkdir(parents=True)
    (out / "adapter_model.safetensors").write_bytes(b"the trained adapter")
    (out / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny / "model")}))
    (out / "README.md").write_text("---\nlibrary_name: peft\n---\n# tiny\n")
    signed = manifest.build_output(
        out, job_id=pushing, run_id=spec.run_id, key=bytes.fromhex(env["TUNEBOT_JOB_KEY"])
    )
    body = json.dumps(signed).encode()
    (out / manifest.OUTPUT_MANIFEST).write_bytes(body)
    done = {
        "version": 1,
        "job_id": pushing,
        "seq": 0,
        "kind": "finished",
        "step": 5,
        "max_steps": 5,
        "output_uri": spec.output_uri,
        "manifest_sha256": manifest.sha256_of(body),
        "timestamp": 1.0,
    }
    key = bytes.fromhex(env["TUNEBOT_JOB_KEY"])
    instance = next(i for i, inst in fake.instances.items() if inst.label and pushing in inst.label)
    fake.set_status(instance, InstanceStatus.exited, 0)
    assert eng.record_runner_event(pushing, spec.report.token, sign(key, EVENT, done))
    deadline = time.monotonic() + 60
    while eng.get_job(pushing).state != "succeeded" and time.monotonic() < deadline:
        eng.tick()  # (the pushed event is finishing the job in a thread meanwhile: one of them pushes)
        time.sleep(0.2)
    join_finisher(pushing)  # when the thread finished it, it announces after the final state commits
    view = eng.get_job(pushing)
    assert view.state == "succeeded", view
    repo = hub.repos["acme/tiny-lora"]  # pushed by the bot, with its own token
    assert repo.private and repo.files["adapter_model.safetensors"] == b"the trained adapter"
    assert f".tunebot/job-{pushing}.json" in repo.files and "manifest.json" not in repo.files
    assert str(tiny) not in repo.files["adapter_config.json"].decode()  # public form
    finished = [e for e in rec.events if e.kind == "finished" and e.job_id == pushing]
    assert finished and f"Pushed to the Hub: {hub.url}/acme/tiny-lora" in finished[-1].message
    assert hub.repos["victim/prod-model"].files == {"README.md": b"prod"}
    eng.close()
