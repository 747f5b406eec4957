"""Hub pushes (issue 19): never over a repo the job did not create, and nothing pushed names where the job's
files live (storage URIs, the host's or the bot's paths). The runner pushes to the fake Hub on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.spec import EventKind, parse_progress
from runner.train import run


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The fake Hub, with HF_ENDPOINT / HF_TOKEN pointing at it (the suite runs with HF_HUB_OFFLINE=1)."""
    import huggingface_hub.constants
    from fakes.hub import FakeHub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_TOKEN", fake.token)
        yield fake


def _last_event(spec: Any) -> Any:
    return parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())[-1]


def test_a_push_never_overwrites_a_repo_the_job_did_not_create(
    runner_job: Callable[..., Any], hub: Any
) -> None:
    """a9605e4: `push_to_hub=acme/prod-model` overwrote the existing repo (create_repo(exist_ok=True))."""
    from fakes.hub import HubRepo

    hub.repos["acme/prod-model"] = HubRepo(
        "acme/prod-model", private=False, files={"README.md": b"production"}
    )
    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/prod-model"})
    summary, code = run(spec)
    assert code == 0 and summary.status == "finished"  # the output itself is kept
    repo = hub.repos["acme/prod-model"]
    assert repo.files == {"README.md": b"production"} and repo.commits == [] and not repo.private
    event = _last_event(spec)
    assert event.kind is EventKind.finished and event.hub_url is None
    assert "already exists and this job did not create it" in (event.message or "")
    assert (Path(spec.output_uri) / "adapter_model.safetensors").exists()


def test_a_resumed_job_pushes_again_to_the_repo_it_created(runner_job: Callable[..., Any], hub: Any) -> None:
    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/tiny-lora"})
    assert run(spec)[1] == 0
    repo = hub.repos["acme/tiny-lora"]
    assert f".tunebot/job-{spec.job_id}.json" in repo.files and repo.private
    first = len(repo.commits)
    again = spec.model_copy(
        update={"max_steps": 3}
    )  # the same job, relaunched: it may push over its own repo
    assert run(again)[1] == 0 and len(repo.commits) == first + 1 and _last_event(again).hub_url
    other = spec.model_copy(update={"job_id": "someone-else"})
    assert run(other)[1] == 0 and len(repo.commits) == first + 1  # another job: refused
    assert "did not create it" in (_last_event(other).message or "")


def test_pushed_files_name_no_storage_uri_or_local_path(
    runner_job: Callable[..., Any], hub: Any, tmp_path: Path
) -> None:
    """a9605e4: the pushed job.json named the checkpoint and output URIs, the dataset's path and the model's
    folder; the card named the dataset's path."""
    import json

    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/tiny-lora"})
    assert run(spec)[1] == 0
    files = hub.repos["acme/tiny-lora"].files
    private = {
        spec.checkpoint.uri,
        spec.output_uri,
        spec.dataset.uri,
        spec.base_model,
        str(tmp_path),
        "/tmp/",
    }
    for name, data in files.items():
        text = data.decode("utf-8", "replace")
        leaks = [p for p in private if p and p in text]
        assert not leaks, (name, leaks)
    pushed = json.loads(files["job.json"])
    assert pushed["job_id"] == spec.job_id and pushed["method"] == spec.method.value  # still says what ran
    assert pushed["dataset"]["uri"] == Path(spec.dataset.uri).name
    assert "checkpoint" not in pushed and "output_uri" not in pushed and "report" not in pushed
    assert "records from `" + Path(spec.dataset.uri).name in files["README.md"].decode()
    # The bucket copy keeps the full spec (minus the token): the operator's own record of the run.
    assert (
        json.loads((Path(spec.output_uri) / "job.json").read_text())["checkpoint"]["uri"]
        == spec.checkpoint.uri
    )
