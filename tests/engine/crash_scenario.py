"""Run by test_crash.py in a subprocess: drive one job until TUNEBOT_CRASH_AT kills this process.

Usage: crash_scenario.py MODE DB_URL WORKDIR DATA_DIR COMMAND_JSON   (MODE: launch | recover | finish | vast)

MODE vast launches on a fake Vast (TUNEBOT_TEST_VAST_URL, TUNEBOT_TEST_VAST_KEY, TUNEBOT_TEST_VAST_ASK: the
ask to rent) with checkpoints in TUNEBOT_CHECKPOINT_URI; with a finish.* crash point it then stops the job.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (for engine.fakes)

from bot.engine.service import Engine  # noqa: E402
from bot.planner.request import EstimateRequest  # noqa: E402
from bot.providers.local import LocalProvider  # noqa: E402
from bot.settings import Settings  # noqa: E402
from engine.fakes import make_estimate  # noqa: E402


def main() -> int:
    mode, db_url, workdir, data_dir, command = sys.argv[1:6]
    settings = Settings(TUNEBOT_DATA_DIR=data_dir)
    local = LocalProvider(workdir=workdir, runner_command=json.loads(command))
    if mode == "vast":
        return on_vast(settings, db_url, data_dir)
    eng = Engine(settings, db_url=db_url, providers={"local": local})
    eng.terminate_deadline_s = 10.0
    data = Path(data_dir) / "train.jsonl"  # job creation reads the data before launching
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps({"instruction": "Say hi.", "input": "", "output": "hi"}) + "\n")
    req = EstimateRequest(model="tiny", dataset=str(data))
    job = eng.create_job(
        req, user="alice", estimate=make_estimate([local.offer()]), idempotency_key="crash-job"
    )
    print(job.job_id, flush=True)
    if mode == "recover":
        time.sleep(1.0)  # let the runner stand-in install its SIGTERM handler
        local.preempt(local.list_instances()[0].instance_id, 5.0)
    deadline = time.time() + 30
    while time.time() < deadline:
        eng.tick()
        time.sleep(0.1)
    return 3  # the crash point was never reached


def on_vast(settings: Settings, db_url: str, data_dir: str) -> int:

    from bot.providers.vast import VastProvider

    vast = VastProvider(
        api_key=os.environ["TUNEBOT_TEST_VAST_KEY"], base_url=os.environ["TUNEBOT_TEST_VAST_URL"]
    )
    ask = int(os.environ["TUNEBOT_TEST_VAST_ASK"])
    (offer,) = vast._search(
        {"id": {"eq": ask}, "type": "on-demand", "rentable": {"eq": True}, "limit": 1}, interruptible=False
    )
    eng = Engine(settings, db_url=db_url, providers={"vast": vast})
    data = Path(data_dir) / "train.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps({"instruction": "Say hi.", "input": "", "output": "hi"}) + "\n")
    job = eng.create_job(
        EstimateRequest(model="tiny", dataset=str(data)),
        user="alice",
        estimate=make_estimate([offer]),
        idempotency_key="crash-vast",
    )
    print(job.job_id, flush=True)
    if os.environ.get("TUNEBOT_CRASH_AT", "").startswith("finish."):
        time.sleep(1.0)  # Vast bills a second of running
        eng.stop(job.job_id, user="alice")  # no graceful stop on Vast: the finish terminates at once
    return 3  # the launch inside create_job reaches launch.after_provider_create first


if __name__ == "__main__":
    sys.exit(main())
