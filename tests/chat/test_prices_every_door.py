"""One price source for every door: `tunebot estimate`, the console and `tunebot launch` agree.

Three real CLI processes against the fake Vast API on 127.0.0.1 (VAST_API_KEY and VAST_API_URL set), with
moto S3 for checkpoints and a fake registry holding the runner image. On a9605e4 `tunebot estimate` priced
from the dated snapshot even with a key set, while the console and launch priced live: its cheapest was not
what launch rented.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.clouds import FakeVast
from fakes.clouds.fixtures import use_fake_env
from fakes.registry import FakeRegistry
from fakes.s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)

from bot.money import money

pytestmark = pytest.mark.slow
MODEL = "meta-llama/Llama-3.2-1B"


@pytest.fixture
def doors(tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeVast, dict]]:  # noqa: F811
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"instruction": f"add {i} and {i}", "input": "", "output": str(2 * i)}) + "\n"
            for i in range(60)
        )
    )
    with FakeVast(n_offers=60, seed=11) as vast, FakeRegistry() as registry:
        registry.push("tunebot/tunebot-runner", "0.1.0")
        use_fake_env(monkeypatch, vast)
        env = {
            **os.environ,
            "TUNEBOT_DATA_DIR": str(tmp_path / "data"),
            "COLUMNS": "200",
            "TUNEBOT_CHECKPOINT_URI": f"{s3_bucket}/tunebot",
            "TUNEBOT_MIN_RELIABILITY": "0",
            "TUNEBOT_RUNNER_IMAGE": registry.image("tunebot/tunebot-runner", "0.1.0"),
            "DATA": str(data),
        }
        yield vast, env  # type: ignore[misc]


def cli(env: dict, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from bot.cli import main; main()", *args]
    done = subprocess.run(command, input=stdin, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_estimate_console_and_launch_agree_on_the_cheapest_offer_and_its_price(
    doors: tuple[FakeVast, dict],
) -> None:
    vast, env = doors
    dataset = f"dataset={env['DATA']}"
    # 1. `tunebot estimate`: live, and saying which prices are live and which come from the snapshot.
    shown = cli(env, "estimate", MODEL, dataset, "--json")
    est = json.loads(shown.stdout)
    cheapest = next(o for o in est["offers"] if "cheapest" in o["labels"])
    assert cheapest["provider"] == "vast" and cheapest["source"] == "live"
    assert est["prices_source"] == "mixed"  # vast live; the clouds without a key from their snapshot
    notes = " ".join(est["assumptions"])
    assert "vast: live prices as of" in notes
    assert "runpod: no RUNPOD_API_KEY" in notes and "snapshot" in notes
    human = cli(env, "estimate", MODEL, dataset)
    assert "Asking vast for live prices" in human.stderr and "--offline" in human.stderr
    offline = json.loads(cli(env, "estimate", MODEL, dataset, "--json", "--offline").stdout)
    assert offline["prices_source"] == "snapshot" and "vast: live" not in " ".join(offline["assumptions"])
    assert next(o for o in offline["offers"] if "cheapest" in o["labels"])["source"] == "snapshot"
    # 2. The console: the same offer, the same price.
    console = cli(env, "console", stdin=f"estimate {MODEL} {dataset}\nexit\n").stdout
    row = next(line for line in console.splitlines() if "cheapest" in line and "vast" in line)
    assert cheapest["gpu"] in row and money(cheapest["price_per_hour"]) in row, row
    # 3. `tunebot launch`: rents that very offer.
    launched = cli(env, "launch", MODEL, dataset).stdout
    creates = [path for _, path, op in vast.requests if op == "create"]
    assert len(creates) == 1 and creates[0].rstrip("/").rsplit("/", 1)[-1] == cheapest["offer_id"], launched
    assert money(cheapest["price_per_hour"]) in launched


# --- the local door (issue 27): with TUNEBOT_LOCAL_PROVIDER=1 and no cloud key, `tunebot estimate` called
# Vast rtx-3090 the cheapest and answered "Nothing fits" to --gpu cpu, while `tunebot launch` ran on this CPU.


@pytest.fixture
def local_door(tmp_path: Path) -> dict:
    from runner.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny").parent
    return {
        **os.environ,
        "TUNEBOT_DATA_DIR": str(tmp_path / "data"),
        "TUNEBOT_LOCAL_PROVIDER": "1",
        "COLUMNS": "200",
        "TUNEBOT_CHAT_DATA_DIR": str(tiny),  # the folder Slack users may name files in
        "MODEL": str(tiny / "model"),
        "DATA": str(tiny / "data.jsonl"),
    }


def _fitting(est: dict) -> list[tuple[str, str, int, bool]]:
    return [(o["provider"], o["gpu"], o["gpu_count"], o["interruptible"]) for o in est["offers"] if o["fits"]]


def _slack_estimate(env: dict, text: str) -> str:
    """`/tune estimate ...` as `tunebot serve` answers it (its engine and chat handlers, in this process)."""
    from bot.chat.blockkit import to_message
    from bot.chat.handlers import Actor
    from bot.commands.chat_commands import _runtime
    from bot.settings import get_settings

    saved = dict(os.environ)
    names = ("TUNEBOT_DATA_DIR", "TUNEBOT_LOCAL_PROVIDER", "TUNEBOT_CHAT_DATA_DIR")
    os.environ.update({k: env[k] for k in names})
    # As a fresh `tunebot serve` quotes before its first launch: no prewarmed runner yet (another test in this
    # process may have left one ready, which quotes a start-up seconds shorter than the CLI's)
    os.environ["TUNEBOT_LOCAL_PREWARM"] = "0"
    get_settings.cache_clear()
    try:
        _, engine, chat = _runtime(serving=True)
        try:
            message = to_message(chat.handle_text(text, Actor("U_ALICE", "C1")))
        finally:
            engine.close()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()
    return message["text"] + str(message["blocks"])


def test_estimate_console_slack_and_launch_agree_on_the_local_door(local_door: dict) -> None:
    env = local_door
    request = [env["MODEL"], f"dataset={env['DATA']}", "steps=2", "seq=64"]
    est = json.loads(cli(env, "estimate", *request, "--json").stdout)
    cheapest = next(o for o in est["offers"] if "cheapest" in o["labels"])
    assert (cheapest["provider"], cheapest["gpu"]) == ("local", "cpu"), cheapest
    # the clouds' snapshot offers are listed too, saying what would make them launchable
    assert any(o["provider"] == "vast" and "VAST_API_KEY" in o["reason"] for o in est["offers"] if o["fits"])
    on_cpu = json.loads(cli(env, "estimate", *request, "--gpu", "cpu", "--json").stdout)
    assert _fitting(on_cpu) == [("local", "cpu", 1, False)] and not on_cpu["suggestions"]
    assert "cheapest" in on_cpu["offers"][0]["labels"]
    # the console: the same offers, local the cheapest
    console = cli(env, "console", stdin=f"estimate {' '.join(request)}\nexit\n").stdout
    row = next(line for line in console.splitlines() if "cheapest" in line)
    assert "local" in row and "cpu" in row and money(cheapest["total_cost"]) in row, row
    # Slack, as `tunebot serve` answers with TUNEBOT_LOCAL_PROVIDER=1
    slack = _slack_estimate(env, f"estimate {' '.join(request)}")
    assert "local" in slack and money(cheapest["total_cost"]) in slack, slack[:3000]
    # `tunebot launch`: rents the offer the estimate called cheapest
    launched = cli(env, "launch", *request)
    jobs = json.loads(cli(env, "jobs", "--json").stdout)
    assert len(jobs) == 1 and jobs[0]["provider"] == "local" and jobs[0]["gpu"] == "cpu", launched.stdout
    cli(env, "stop", jobs[0]["job_id"])
