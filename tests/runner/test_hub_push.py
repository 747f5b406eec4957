"""Hub pushes (issue 19): never over a repo the job did not create, and nothing pushed names where the job's
files live (storage URIs, the host's or the bot's paths). Since issue 28 the bot pushes, with its own token,
the output its run signed; the runner never pushes (it holds no token that can write). The runner trains to
its output folder here and the bot's push (bot/engine/outcome/hub_push.py: the output checked against the
manifest the run signed, then runner/contract/publish.py push_folder) goes to the fake Hub on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.contract.spec import EventKind, parse_progress
from runner.train import run

KEY = bytes.fromhex("3d" * 32)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The fake Hub (the suite runs with HF_HUB_OFFLINE=1). The runner's environment has the Hub's token
    too: it must not push with it all the same."""
    import huggingface_hub.constants
    from fakes.hub import FakeHub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("TUNEBOT_JOB_KEY", KEY.hex())
    with FakeHub() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_TOKEN", fake.token)
        yield fake


def _last_event(spec: Any) -> Any:
    return parse_progress((Path(spec.checkpoint.uri) / "progress.json").read_bytes())[-1]


def bot_push(spec: Any, hub: Any, tmp_path: Path, *, token: str | None = None) -> str:
    """What the bot does at the finish: the output the run's terminal event vouches for, file by file, pushed
    with the bot's own token. Raises PushRefused as the bot's push would."""
    import tempfile

    from bot.engine.outcome.hub_push import verified_output
    from runner.contract.publish import push_folder

    event = _last_event(spec)
    assert event.kind is EventKind.finished and event.manifest_sha256, event
    folder = Path(tempfile.mkdtemp(prefix="bot-push-", dir=tmp_path))  # under the test's folder: nothing left
    verified_output(spec.output_uri, spec.job_id, event.manifest_sha256, KEY, folder)
    assert spec.push_to_hub is not None
    return push_folder(
        folder,
        spec.push_to_hub,
        spec,
        message="tunebot job: finished",
        token=token or hub.token,
        endpoint=hub.url,
    )


def test_a_push_never_overwrites_a_repo_the_job_did_not_create(
    runner_job: Callable[..., Any], hub: Any, tmp_path: Path
) -> None:
    """a9605e4: `push_to_hub=acme/prod-model` overwrote the existing repo (create_repo(exist_ok=True))."""
    from fakes.hub import HubRepo

    from runner.contract.publish import PushRefused

    hub.repos["acme/prod-model"] = HubRepo(
        "acme/prod-model", private=False, files={"README.md": b"production"}
    )
    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/prod-model"})
    summary, code = run(spec)
    assert code == 0 and summary.status == "finished"  # the output itself is kept
    with pytest.raises(PushRefused, match="already exists and this job did not create it"):
        bot_push(spec, hub, tmp_path)
    repo = hub.repos["acme/prod-model"]
    assert repo.files == {"README.md": b"production"} and repo.commits == [] and not repo.private
    event = _last_event(spec)
    assert event.kind is EventKind.finished and event.hub_url is None
    assert (Path(spec.output_uri) / "adapter_model.safetensors").exists()


def test_the_runner_never_pushes_even_with_a_token_in_its_environment(
    runner_job: Callable[..., Any], hub: Any
) -> None:
    """eac3cff: the runner pushed with the HF_TOKEN its host was given (issue 28: a host used the team's token
    to overwrite a repo outside the allowed namespaces)."""
    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "victim/prod-model"})
    assert run(spec)[1] == 0
    assert hub.repos == {} and not [r for r in hub.requests if r[0] == "POST"]


def test_a_resumed_job_pushes_again_to_the_repo_it_created(
    runner_job: Callable[..., Any], hub: Any, tmp_path: Path
) -> None:
    from runner.contract.publish import PushRefused

    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/tiny-lora"})
    assert run(spec)[1] == 0
    bot_push(spec, hub, tmp_path)
    repo = hub.repos["acme/tiny-lora"]
    assert f".tunebot/job-{spec.job_id}.json" in repo.files and repo.private
    first = len(repo.commits)
    again = spec.model_copy(
        update={"max_steps": 3}
    )  # the same job, relaunched: it may push over its own repo
    assert run(again)[1] == 0
    assert bot_push(again, hub, tmp_path) and len(repo.commits) == first + 1
    other = spec.model_copy(update={"job_id": "someone-else"})
    assert run(other)[1] == 0
    with pytest.raises(PushRefused, match="did not create it"):  # another job: refused
        bot_push(other, hub, tmp_path)
    assert len(repo.commits) == first + 1


def test_a_swapped_output_file_is_never_pushed(
    runner_job: Callable[..., Any], hub: Any, tmp_path: Path
) -> None:
    """The output as its run signed it, or nothing: a file changed after the run's manifest (a former host
    that can still write the folder) stops the push."""
    from bot.engine.outcome.hub_push import NotPushed

    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/tiny-lora"})
    assert run(spec)[1] == 0
    (Path(spec.output_uri) / "adapter_model.safetensors").write_bytes(b"someone else's weights")
    with pytest.raises(NotPushed, match="does not match what its run signed"):
        bot_push(spec, hub, tmp_path)
    assert hub.repos == {}


def test_pushed_files_name_no_storage_uri_or_local_path(
    runner_job: Callable[..., Any], hub: Any, tmp_path: Path
) -> None:
    """a9605e4: the pushed job.json named the checkpoint and output URIs, the dataset's path and the model's
    folder; the card named the dataset's path."""
    import json

    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/tiny-lora"})
    assert run(spec)[1] == 0
    bot_push(spec, hub, tmp_path)
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
    assert "manifest.json" not in files  # the bot's check, not part of the model
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


def test_the_bots_push_creates_a_private_repo_with_the_adapter_and_the_card(
    runner_job: Callable[..., Any], hub: Any, tmp_path: Path
) -> None:
    """Moved here from test_job_checks when the push moved to the bot (issue 28): the run's output, pushed
    by the bot, is a private repo with the adapter, the card and the tokenizer, and the adapter loads."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/tiny-lora"})
    summary, code = run(spec)
    assert code == 0, summary
    url = bot_push(spec, hub, tmp_path)
    assert url == f"{hub.url}/acme/tiny-lora"
    repo = hub.repos["acme/tiny-lora"]
    assert repo.private  # private unless asked otherwise
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "tokenizer.json"} <= set(
        repo.files
    )
    pulled = repo.write_to(tmp_path / "pulled")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(spec.base_model), str(pulled))
    assert any("lora_A" in n for n, _ in model.named_parameters())


def test_a_refused_push_keeps_the_output_and_says_why(
    runner_job: Callable[..., Any], hub: Any, tmp_path: Path
) -> None:
    """A push the Hub refuses (a wrong token) loses nothing: the output stays in storage and the refusal
    names the Hub's reason (bot/engine/outcome/hub_push.py writes it into the job's message as "not pushed to
    the Hub (...)")."""
    import huggingface_hub

    spec = runner_job(max_steps=2, seq_len=128, grad_accum=1, push_to_hub={"repo": "acme/tiny-lora"})
    summary, code = run(spec)
    assert code == 0 and summary.status == "finished"
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError) as refused:
        bot_push(spec, hub, tmp_path, token="hf_wrong_token")  # refused by the Hub
    assert "401" in str(refused.value) or "Unauthorized" in str(refused.value)
    assert (Path(spec.output_uri) / "adapter_model.safetensors").exists()
    assert "acme/tiny-lora" not in hub.repos
