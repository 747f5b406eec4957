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
