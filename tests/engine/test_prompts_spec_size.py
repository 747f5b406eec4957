"""A prompts file cannot make a job that can never start (issue 38, item 2).

Played on 9a0c9c1: eight ~60 KB lines of `prompts=FILE`, each a valid prompt with an extra key, travelled into
the spec whole; TUNEBOT_JOB_SPEC was 481,848 bytes, past the 131,072 bytes Linux takes for one environment
string, and the runner's start failed with E2BIG after the instance was rented. Now only the keys a prompt is
made of enter the spec, the prompts are bounded together, and a spec that could not reach a host is refused
before anything is created or rented.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes.snapshot_plan import snapshot_plan as plan_estimate

from bot.engine.api import EngineError
from bot.engine.launching import offers as offers_mod
from bot.engine.launching.staging import MAX_ENV_STRING, spec_env_bytes
from bot.planner.request import EstimateRequest
from bot.settings import Settings
from runner.contract.prompts import MAX_PROMPT_MESSAGES, prompts_of, read_prompt_lines
from runner.contract.reading import DatasetError
from runner.contract.spec import JobSpec

from .fakes import FakeProvider

ROWS = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runner.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny")).parent


def _engine(tmp_path: Path, fake: FakeProvider):  # type: ignore[no-untyped-def]
    from bot.engine.service import Engine

    settings = Settings(TUNEBOT_DATA_DIR=str(tmp_path / "data"))
    return Engine(settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={fake.name: fake})


def _create(eng, fake: FakeProvider, tiny: Path, prompts: Path, **extra):  # type: ignore[no-untyped-def]
    data = tiny.parent / "prompts-data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    req = EstimateRequest(model=str(tiny / "model"), dataset=str(data), prompts=str(prompts), samples=8)
    est = offers_mod.for_this_engine(plan_estimate(req, offers=[fake.offer()]), eng.providers, [])
    return eng.create_job(req, user="alice", estimate=est, **extra)


def test_extra_keys_of_a_prompts_file_never_reach_the_spec_a_host_starts_with(
    tmp_path: Path, tiny: Path
) -> None:
    padding = "x" * 60_000
    lines = [{"prompt": f"Say {i}.", "notes": padding} for i in range(4)]
    lines += [
        {
            "messages": [
                {"role": "user", "content": "Hi?", "meta": padding},
                {"role": "assistant", "content": "Hi"},
            ]
        },
        {"instruction": "Add 1 and 1.", "input": "", "source": padding},
        {"text": "Once upon", "tags": [padding]},
        {"prompt": "Last one.", "a": padding, "b": 1},
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert prompts.stat().st_size > 8 * 60_000  # what made a 481,848-byte spec
    fake = FakeProvider("fake")
    eng = _engine(tmp_path, fake)
    job = _create(eng, fake, tiny, prompts)
    assert job.state == "running", job.message
    env = fake.launch_requests[-1].env
    assert spec_env_bytes(env["TUNEBOT_JOB_SPEC"]) < MAX_ENV_STRING // 4, len(env["TUNEBOT_JOB_SPEC"])
    spec = JobSpec.model_validate_json(env["TUNEBOT_JOB_SPEC"])
    assert spec.samples.prompts == [
        {"prompt": "Say 0."},
        {"prompt": "Say 1."},
        {"prompt": "Say 2."},
        {"prompt": "Say 3."},
        {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hi"}]},
        {"instruction": "Add 1 and 1.", "input": ""},
        {"text": "Once upon"},
        {"prompt": "Last one."},
    ]
    assert len(prompts_of(spec.samples.prompts)) == 8  # what the runner reads back: every prompt, checked
    eng.close()


def test_prompts_too_large_together_are_refused_before_anything_is_rented(tmp_path: Path, tiny: Path) -> None:
    """Each prompt within its 2,000 characters, but control characters JSON escapes six bytes each."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}" + "\u0001" * 1990}) + "\n" for i in range(8)))
    fake = FakeProvider("fake")
    eng = _engine(tmp_path, fake)
    with pytest.raises(EngineError, match=r"prompts: .*the prompts take [\d,]+ bytes as the job carries"):
        _create(eng, fake, tiny, prompts)
    assert fake.creates == 0 and eng.list_jobs() == []
    eng.close()


def test_a_spec_no_host_could_start_is_refused_before_the_job_is_created(tmp_path: Path, tiny: Path) -> None:
    """Whatever makes it big (here the operator's own spec overrides): the check is the serialized spec's size
    against the environment limit, before renting."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hi?"}) + "\n")
    fake = FakeProvider("fake")
    eng = _engine(tmp_path, fake)
    huge = {"dataset": {"name": "n" * MAX_ENV_STRING}}
    with pytest.raises(EngineError, match=r"more than the 131,072 one environment variable may"):
        _create(eng, fake, tiny, prompts, spec_overrides=huge)
    assert fake.creates == 0 and eng.list_jobs() == []
    eng.close()


def test_a_conversation_prompt_is_bounded_in_turns(tmp_path: Path) -> None:
    turns = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}] * MAX_PROMPT_MESSAGES
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [*turns, {"role": "user", "content": "?"}]}) + "\n")
    with pytest.raises(DatasetError, match=f"messages; at most {MAX_PROMPT_MESSAGES}"):
        read_prompt_lines(str(prompts))
