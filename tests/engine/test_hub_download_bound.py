"""A host does not decide how much the bot downloads (issue 38, item 2).

Played on 9a0c9c1: before a Hub push the bot copied every file the host's signed output manifest listed to
its own disk; a tiny LoRA job's host listed a 512 MB "adapter" and the bot downloaded all of it (the host can
fill the disk that holds the bot's database). Replayed here as that host plays it, with exactly what its
instance got (the spec and the run's key): it writes its output with a 512 MB adapter (sparse: nothing is
written to this machine's disk for it) and the manifest it signs, and reports the job finished. The bot
refuses the push before downloading a byte, and says why in the job's thread; the job keeps its output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes.hub import FakeHub
from fakes.snapshot_plan import snapshot_plan as plan_estimate
from fakes.worlds import join_finisher

from bot.engine.launching import offers as offers_mod
from bot.engine.outcome.hub_push import KEEP_FREE_BYTES, NotPushed, download_refusal, verified_output
from bot.planner.request import EstimateRequest
from bot.providers.base import InstanceStatus
from bot.settings import Settings
from runner.contract import manifest
from runner.contract.integrity import EVENT, sign
from runner.contract.spec import JobSpec

from .conftest import Recorder
from .fakes import FakeProvider

WRITE = "hf_team_write_token_38e"
ROWS = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(20)]
HUGE = 512 * 1024**2


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with FakeHub(token=WRITE) as fake:
        yield fake


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny")).parent


def _host_output(out: Path, job_id: str, run_id: str | None, key: bytes, adapter_bytes: int) -> bytes:
    """What the job's host writes: its output folder with an adapter of ``adapter_bytes`` and the manifest it
    signs with its run's key; the manifest's bytes."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "adapter_model.safetensors", "wb") as fh:
        fh.truncate(adapter_bytes)  # sparse: the size is claimed and real, the disk is not used
    (out / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (out / "README.md").write_text("---\nlibrary_name: peft\n---\n# tiny\n")
    body = json.dumps(manifest.build_output(out, job_id=job_id, run_id=run_id, key=key)).encode()
    (out / manifest.OUTPUT_MANIFEST).write_bytes(body)
    return body


def test_a_host_listing_a_512_mb_adapter_for_a_tiny_lora_job_gets_nothing_downloaded(
    tmp_path: Path, tiny: Path, hub: FakeHub
) -> None:
    from bot.engine.service import Engine

    fake = FakeProvider("fake", memory_gb=80)  # shares the bot's disk: the job's folder is a local path
    settings = Settings(
        TUNEBOT_DATA_DIR=str(tmp_path / "data"),
        HF_TOKEN=WRITE,
        HF_ENDPOINT=hub.url,
        TUNEBOT_HUB_NAMESPACES="acme",
    )
    eng = Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"fake": fake})
    rec = Recorder(eng.bus)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    req = EstimateRequest(
        model=str(tiny / "model"), dataset=str(data), push_to_hub="acme/tiny-lora", lora_r=8
    )
    est = offers_mod.for_this_engine(plan_estimate(req, offers=[fake.offer()]), eng.providers, [])
    job = eng.create_job(req, user="alice", estimate=est)
    env = dict(fake.launch_requests[-1].env)
    spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
    key = bytes.fromhex(env["TUNEBOT_JOB_KEY"])
    body = _host_output(Path(spec.output_uri), job.job_id, spec.run_id, key, HUGE)
    done = {
        "version": 1,
        "job_id": job.job_id,
        "seq": 0,
        "kind": "finished",
        "step": 5,
        "max_steps": 5,
        "output_uri": spec.output_uri,
        "manifest_sha256": manifest.sha256_of(body),
        "timestamp": 1.0,
    }
    instance = next(i for i, inst in fake.instances.items() if inst.label and job.job_id in inst.label)
    fake.set_status(instance, InstanceStatus.exited, 0)
    assert eng.record_runner_event(job.job_id, spec.report.token, sign(key, EVENT, done))
    deadline = time.monotonic() + 120
    while eng.get_job(job.job_id).state != "succeeded" and time.monotonic() < deadline:
        eng.tick()
        time.sleep(0.2)
    join_finisher(job.job_id)
    view = eng.get_job(job.job_id)
    assert view.state == "succeeded", view  # a refused push never fails the job: its output stays
    assert "acme/tiny-lora" not in hub.repos
    why = "not pushed to the Hub (the output lists 512.0 MB, more than this job can produce (at most"
    assert why in (view.message or ""), view.message
    finished = [e for e in rec.events if e.kind == "finished" and e.job_id == job.job_id]
    assert finished and why in finished[-1].message  # said in the job's thread
    assert (Path(spec.output_uri) / "adapter_model.safetensors").stat().st_size == HUGE
    eng.close()


def test_the_refusal_comes_before_a_byte_is_fetched(tmp_path: Path) -> None:
    """The same output read by the bot's download itself: refused on the manifest's sizes, nothing written
    where it downloads; an honest output of the same job is fetched whole."""
    key = bytes(range(32))
    out, into = tmp_path / "out", tmp_path / "into"
    into.mkdir()
    body = _host_output(out, "j1", "r1", key, HUGE)
    limit = (
        64 * 1024**2 + 80 * 1024,
        "16,384 trained parameters at 4 bytes, 25% room, 64.0 MB of other files",
    )
    with pytest.raises(NotPushed, match="the output lists 512.0 MB, more than this job can produce"):
        verified_output(str(out), "j1", manifest.sha256_of(body), key, into, limit=limit)
    assert list(into.iterdir()) == []
    body = _host_output(out, "j1", "r1", key, 65_536)
    verified_output(str(out), "j1", manifest.sha256_of(body), key, into, limit=limit)
    assert (into / "adapter_model.safetensors").stat().st_size == 65_536


def test_no_download_leaves_the_disk_with_less_than_it_keeps_free() -> None:
    gb = 1024**3
    assert download_refusal(gb, (10 * gb, "x"), free=KEEP_FREE_BYTES + 2 * gb) is None
    said = download_refusal(gb, (10 * gb, "x"), free=KEEP_FREE_BYTES + gb // 2)
    assert said and "the bot's disk has 2.5 GB free (it keeps 2.0 GB free); nothing was downloaded" in said
