"""From /tune to the JobSpec a host gets: what the estimate priced reaches the runner, checked before renting.

Issue 10's seams, each one a test: the dataset format the estimate detected, LoRA targets resolved to the
model's module names, object storage a remote host can reach (refused when it is the bot's disk), local
inputs staged there, storage credentials as instance environment only, W&B online with its link in the
thread, and a runner failure told with the runner's own line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes.snapshot_plan import snapshot_plan as plan_estimate

from bot.engine.api import EngineError
from bot.engine.launching import offers as offers_mod
from bot.planner.request import EstimateRequest
from bot.settings import Settings
from runner.contract.spec import EventKind, JobSpec, RunnerEvent

from .conftest import Recorder
from .fakes import FakeProvider

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


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def make_engine(tmp_path: Path, provider: FakeProvider, **env: Any) -> Any:
    from bot.engine.service import Engine

    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"), **env)
    return Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={provider.name: provider})


def planned(eng: Any, req: EstimateRequest, provider: FakeProvider) -> Any:
    """The real planner's estimate on this provider's offer, labelled like Engine.estimate does."""
    return offers_mod.for_this_engine(plan_estimate(req, offers=[provider.offer()]), eng.providers, [])


def launched_spec(provider: FakeProvider) -> tuple[JobSpec, dict[str, str]]:
    env = provider.launch_requests[-1].env
    return JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"]), env


def test_what_the_estimate_priced_reaches_the_spec_unchanged(tmp_path: Path, tiny: Path) -> None:
    """A chat dataset, q,v targets, hyperparameters: the old launch sent only the dataset path (the runner
    assumed alpaca) and the typed targets (peft found no module named "q")."""
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    fake = FakeProvider("fake", price=0.5)
    eng = make_engine(tmp_path, fake)
    req = EstimateRequest(
        model=str(tiny / "model"),
        dataset=str(data),
        lora_targets=["q", "v"],
        lora_r=8,
        learning_rate=1e-3,
        eval_split=0.1,
        plateau_patience=4,
        seed=7,
        seq_len=256,
        max_steps=12,
        lr_scheduler="linear",
        warmup_ratio=0.1,
        lora_dropout=0.05,
    )
    est = planned(eng, req, fake)
    assert est.training.dataset_format == "messages"
    assert est.training.lora_targets == ["q_proj", "v_proj"]
    job = eng.create_job(req, user="alice", estimate=est)
    assert job.state == "running", job.message
    spec, _ = launched_spec(fake)
    assert spec.dataset.format.value == "messages" and spec.dataset.uri == str(data)
    assert spec.lora.target_modules == ["q_proj", "v_proj"] and (spec.lora.r, spec.lora.alpha) == (8, 16)
    assert spec.lora.dropout == 0.05 and spec.dataset.eval_fraction == 0.1
    assert (spec.learning_rate, spec.lr_scheduler, spec.warmup_ratio) == (1e-3, "linear", 0.1)
    assert (spec.seed, spec.max_steps, spec.seq_len) == (7, 12, 256)
    assert spec.plateau.enabled and spec.plateau.patience == 4
    # checkpointing as the planner chose it for the card (bot/planner/batch_choice.py), as priced
    assert (spec.optimizer, spec.attn) == (req.optimizer, req.attn)
    plan = est.training
    assert (spec.gradient_checkpointing, spec.loss) == (plan.gradient_checkpointing, plan.loss)
    assert spec.base_model == str(tiny / "model")
    eng.close()


def test_plateau_can_be_turned_off_and_an_alias_becomes_the_hub_id(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "hello world"}] * 5)
    fake = FakeProvider("fake", price=0.5)
    eng = make_engine(tmp_path, fake)
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data), plateau=False, tokens=None)
    eng.create_job(req, user="alice", estimate=planned(eng, req, fake))
    spec, _ = launched_spec(fake)
    assert spec.plateau.enabled is False
    assert spec.base_model == "meta-llama/Llama-3.2-1B"  # the runner cannot download "llama-3.2-1b"
    assert spec.dataset.format.value == "text"
    eng.close()


def test_a_bad_dataset_is_refused_with_its_line_before_anything_is_rented(tmp_path: Path) -> None:
    rows: list[Any] = [{"instruction": "a", "output": "b"}] * 2 + [{"instruction": "no output here"}]
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    fake = FakeProvider("fake")
    eng = make_engine(tmp_path, fake)
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    with pytest.raises(EngineError, match=r"bad.jsonl:3: alpaca record is missing the key 'output'"):
        eng.create_job(req, user="alice", estimate=planned(eng, req, fake))
    assert fake.creates == 0 and eng.list_jobs() == []
    eng.close()


def test_a_cloud_job_on_the_bots_own_disk_is_refused_naming_the_setting(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    cloud = FakeProvider("vast", kind="container")
    eng = make_engine(tmp_path, cloud)
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    with pytest.raises(EngineError, match="TUNEBOT_CHECKPOINT_URI") as info:
        eng.create_job(req, user="alice", estimate=planned(eng, req, cloud))
    assert "remote host" in str(info.value) and cloud.creates == 0
    # memory:// is this process's memory: no better for a remote host.
    eng.close()
    eng = make_engine(tmp_path / "m", cloud, TUNEBOT_CHECKPOINT_URI="memory://tunebot")
    with pytest.raises(EngineError, match="TUNEBOT_CHECKPOINT_URI"):
        eng.create_job(req, user="alice", estimate=planned(eng, req, cloud))
    eng.close()


def test_a_local_job_keeps_only_same_host_fallbacks_without_object_storage(tmp_path: Path) -> None:
    from bot.engine.service import Engine

    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    here = FakeProvider("local", price=0.1)
    cloud = FakeProvider("vast", price=0.2, kind="container")
    eng = Engine(
        Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data")),
        db_url=f"sqlite:///{tmp_path / 'x.db'}",
        providers={"local": here, "vast": cloud},
    )
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    both = plan_estimate(req, offers=[here.offer(), cloud.offer()])
    est = offers_mod.for_this_engine(both, eng.providers, [])
    job = eng.create_job(req, user="alice", estimate=est, choice="cheapest")
    assert job.provider == "local"
    from store.models import Job

    with eng.session() as s:
        fallbacks = {o["provider"] for o in s.get(Job, job.job_id).offers}
    assert fallbacks == {"local"}
    eng.close()


def test_inputs_are_staged_to_object_storage_and_credentials_travel_only_as_instance_env(
    tmp_path: Path, tiny: Path, s3_bucket: str
) -> None:
    import fsspec

    data = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    cloud = FakeProvider("vast", kind="container")
    eng = make_engine(tmp_path, cloud, TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot")
    rec = Recorder(eng.bus)
    req = EstimateRequest(model=str(tiny / "model"), dataset=str(data), lora_targets=["q", "v"])
    job = eng.create_job(req, user="alice", estimate=planned(eng, req, cloud))
    assert job.state == "running", job.message
    spec, env = launched_spec(cloud)
    assert spec.dataset.uri.startswith(f"{s3_bucket}/tunebot/inputs/") and spec.dataset.name == data.name
    assert spec.base_model.startswith(f"{s3_bucket}/tunebot/inputs/models/model-")
    run = f"{s3_bucket}/tunebot/{job.job_id}/runs/{spec.run_id}"  # each run writes its own folder (issue 28)
    assert spec.checkpoint.uri == f"{run}/checkpoints"
    assert spec.output_uri == f"{run}/output"
    fs = fsspec.filesystem("s3")
    assert fs.cat(spec.dataset.uri) == data.read_bytes()
    assert fs.exists(f"{spec.base_model}/model.safetensors")
    assert fs.exists(f"{spec.base_model}/tokenizer.json")
    secret = "tunebot-test-secret-4f1b"
    assert env["AWS_SECRET_ACCESS_KEY"] == secret and env["AWS_ACCESS_KEY_ID"] == "tunebot-test-key"
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert secret not in env["TUNEBOT_JOB_SPEC"] and "tunebot-test-key" not in env["TUNEBOT_JOB_SPEC"]
    assert all(secret not in e.message and secret not in json.dumps(e.data) for e in rec.events)
    # The same data again: the same staged objects, nothing uploaded twice.
    before = fs.info(spec.dataset.uri)["LastModified"]
    eng.create_job(req, user="bob", estimate=planned(eng, req, cloud))
    again, _ = launched_spec(cloud)
    assert (again.dataset.uri, again.base_model) == (spec.dataset.uri, spec.base_model)
    assert fs.info(spec.dataset.uri)["LastModified"] == before
    eng.close()


def test_s3_storage_without_keys_is_refused(
    tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    cloud = FakeProvider("vast", kind="container")
    eng = make_engine(tmp_path, cloud, TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot")
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    with pytest.raises(EngineError, match="AWS_ACCESS_KEY_ID"):
        eng.create_job(req, user="alice", estimate=planned(eng, req, cloud))
    eng.close()


@pytest.mark.parametrize(
    ("update", "env", "refusal"),
    [
        ({"attn": "flash"}, {}, "TUNEBOT_RUNNER_FLASH_ATTN"),
        ({"push_to_hub": "acme/x"}, {"TUNEBOT_HUB_NAMESPACES": "acme"}, "HF_TOKEN"),
        ({"stack": "unsloth"}, {}, "estimate-only"),
        ({"compile": True}, {}, "estimate-only"),
        ({"autocast": False}, {}, "autocast: estimate-only"),  # the runner's LoRA autocasts (issue 37)
        ({"method": "full", "precision": "bf16", "merge": True}, {}, "drop merge"),  # fits the 24 GB card
        ({"gpus": 2, "optimizer": "adamw_8bit"}, {}, "optimizer=adamw"),
    ],
)
def test_options_the_runner_cannot_honour_are_refused_before_renting(
    tmp_path: Path, s3_bucket: str, update: dict[str, Any], env: dict[str, str], refusal: str
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    cloud = FakeProvider("vast", kind="container", gpu_count=update.get("gpus", 1))
    eng = make_engine(tmp_path, cloud, TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/t", **env)
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data), **update)  # the method's own defaults
    with pytest.raises(EngineError, match=refusal):
        eng.create_job(req, user="alice", estimate=planned(eng, req, cloud))
    assert cloud.creates == 0
    eng.close()


def test_flash_attention_launches_when_the_image_has_it(tmp_path: Path, s3_bucket: str) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    cloud = FakeProvider("vast", kind="container")
    eng = make_engine(tmp_path, cloud, TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/t", TUNEBOT_RUNNER_FLASH_ATTN="1")
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data), attn="flash")
    eng.create_job(req, user="alice", estimate=planned(eng, req, cloud))
    assert launched_spec(cloud)[0].attn == "flash"
    eng.close()


def test_wandb_is_online_with_a_key_and_the_run_link_goes_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the suite's offline default asks for less, and wins
    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    fake = FakeProvider("fake")
    eng = make_engine(
        tmp_path,
        fake,
        WANDB_API_KEY="wandb-secret-key-123456",
        WANDB_ENTITY="acme",
        WANDB_PROJECT="finetunes",
    )
    rec = Recorder(eng.bus)
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    job = eng.create_job(req, user="alice", estimate=planned(eng, req, fake))
    spec, env = launched_spec(fake)
    assert (spec.wandb.mode, spec.wandb.project, spec.wandb.entity) == ("online", "finetunes", "acme")
    assert spec.wandb.run_id == job.job_id and env["WANDB_API_KEY"] == "wandb-secret-key-123456"
    assert "wandb-secret-key" not in env["TUNEBOT_JOB_SPEC"]
    url = "https://wandb.ai/acme/finetunes/runs/" + job.job_id
    eng.record_runner_event(job.job_id, None, {})  # no token: refused
    from bot.engine.watching import runner_events

    runner_events.ingest(
        eng, job.job_id, [RunnerEvent(job_id=job.job_id, seq=0, kind=EventKind.started, wandb_url=url)]
    )
    links = [e for e in rec.events if e.kind == "link"]
    assert len(links) == 1 and links[0].data["url"] == url
    from bot.chat.notifier import milestone_text

    assert url in milestone_text(links[0], None)
    eng.close()


def test_a_runner_failure_reaches_the_person_with_the_runners_own_line(tmp_path: Path) -> None:
    from bot.providers.base import InstanceStatus

    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    fake = FakeProvider("fake")
    eng = make_engine(tmp_path, fake)
    rec = Recorder(eng.bus)
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data))
    job = eng.create_job(req, user="alice", estimate=planned(eng, req, fake))
    line = "invalid job: s3://b/chat.jsonl:1: alpaca record is missing the key 'instruction'"
    from bot.engine.watching import runner_events

    failed_event = RunnerEvent(job_id=job.job_id, seq=0, kind=EventKind.failed, message=line)
    runner_events.ingest(eng, job.job_id, [failed_event])
    (iid,) = fake.instances
    fake.set_status(iid, InstanceStatus.exited, exit_code=2)
    eng.tick()
    view = eng.get_job(job.job_id)
    assert view.state == "failed" and line in (view.message or "")
    failed = [e for e in rec.events if e.kind == "failed"]
    assert failed and line in failed[-1].message
    eng.close()


def test_a_hub_push_is_told_at_the_finish(tmp_path: Path) -> None:
    from bot.providers.base import InstanceStatus

    data = write_jsonl(tmp_path / "d.jsonl", CHAT)
    fake = FakeProvider("fake")
    eng = make_engine(tmp_path, fake, HF_TOKEN="hf_secret_token_9999", TUNEBOT_HUB_NAMESPACES="acme")
    rec = Recorder(eng.bus)
    req = EstimateRequest(model="llama-3.2-1b", dataset=str(data), push_to_hub="acme/llama-lora")
    job = eng.create_job(req, user="alice", estimate=planned(eng, req, fake))
    spec, env = launched_spec(fake)
    assert spec.push_to_hub is not None and spec.push_to_hub.repo == "acme/llama-lora"
    assert spec.push_to_hub.private
    # The bot pushes (issue 28): the host gets no Hub token at all.
    assert "HF_TOKEN" not in env and "hf_secret" not in json.dumps(env)
    from bot.engine.watching import runner_events

    url = "https://huggingface.co/acme/llama-lora"
    done = RunnerEvent(
        job_id=job.job_id, seq=0, kind=EventKind.finished, hub_url=url, output_uri="s3://b/out"
    )
    runner_events.ingest(eng, job.job_id, [done])
    fake.set_status(next(iter(fake.instances)), InstanceStatus.exited, exit_code=0)
    eng.tick()
    finished = [e for e in rec.events if e.kind == "finished"]
    # A runner's word that it pushed is not repeated: the bot says what it did, and why not.
    assert finished and "not pushed to the Hub (no output signed by the job's run" in finished[-1].message
    assert f"Pushed to the Hub: {url}" not in finished[-1].message
    eng.close()


def test_a_dataset_already_in_object_storage_is_counted_checked_and_used_in_place(
    tmp_path: Path, s3_bucket: str
) -> None:
    import fsspec

    uri = f"{s3_bucket}/data/chat.jsonl"
    with fsspec.open(uri, "w") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in CHAT))
    cloud = FakeProvider("vast", kind="container")
    eng = make_engine(tmp_path, cloud, TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot")
    req = EstimateRequest(model="llama-3.2-1b", dataset=uri)
    est = planned(eng, req, cloud)
    assert est.training.dataset_format == "messages" and est.time.tokens > 0
    eng.create_job(req, user="alice", estimate=est)
    spec, _ = launched_spec(cloud)
    assert spec.dataset.uri == uri and spec.dataset.format.value == "messages"  # not copied again
    eng.close()


def test_a_symlink_out_of_a_staged_model_folder_is_refused_and_nothing_outside_is_uploaded(
    tmp_path: Path, tiny: Path, s3_bucket: str
) -> None:
    import shutil

    import fsspec

    secret = tmp_path / "bot-home" / ".aws" / "credentials"
    secret.parent.mkdir(parents=True)
    secret.write_text("[default]\naws_secret_access_key = PLANTED-SECRET\n")
    model = tmp_path / "model"
    shutil.copytree(tiny / "model", model)
    (model / "notes.txt").symlink_to(secret)  # a file link out of the folder
    cloud = FakeProvider("vast", kind="container")
    eng = make_engine(tmp_path, cloud, TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot")
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    req = EstimateRequest(model=str(model), dataset=str(data), lora_targets=["q", "v"])
    with pytest.raises(
        EngineError,
        match=r"notes.txt in the model folder is a symbolic link to something "
        r"outside it: refused",
    ):
        eng.create_job(req, user="mallory", estimate=planned(eng, req, cloud))
    (model / "notes.txt").unlink()
    (model / "extra").symlink_to(secret.parent, target_is_directory=True)  # a folder link out of it
    with pytest.raises(EngineError, match="extra in the model folder is a symbolic link"):
        eng.create_job(req, user="mallory", estimate=planned(eng, req, cloud))
    assert not cloud.launch_requests
    fs = fsspec.filesystem("s3")
    uploaded = [fs.cat(p) for p in fs.find(f"{s3_bucket}/tunebot")]
    assert not any(b"PLANTED-SECRET" in blob for blob in uploaded)
    # links that stay inside the folder are uploaded under their own names
    (model / "extra").unlink()
    (model / "tokenizer-copy.json").symlink_to(model / "tokenizer.json")
    job = eng.create_job(req, user="alice", estimate=planned(eng, req, cloud))
    assert job.state == "running", job.message
    spec, _ = launched_spec(cloud)
    assert fs.cat(f"{spec.base_model}/tokenizer-copy.json") == (model / "tokenizer.json").read_bytes()
    eng.close()


def test_a_hugging_face_cache_snapshot_stages_through_its_blob_links(tmp_path: Path, tiny: Path) -> None:
    from bot.engine.launching.staging import folder_files

    repo = tmp_path / "hub" / "models--acme--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for source in sorted((tiny / "model").iterdir()):
        blob = repo / "blobs" / f"sha-{source.name}"
        blob.write_bytes(source.read_bytes())
        (snapshot / source.name).symlink_to(Path("../../blobs") / blob.name)
    names = [p.name for p in folder_files(snapshot)]
    assert names == sorted(p.name for p in (tiny / "model").iterdir())
