"""A supervision tick with 10,000 running jobs on the four fake clouds: first and steady ticks vs 2 s.

Usage: .venv/bin/python bench/engine_tick.py [--db URL] [--jobs 10000] [--events 20]
2,500 running jobs per cloud (Vast, RunPod, Lambda, TensorDock fake servers on 127.0.0.1, real
clients over HTTP), each with its instance row, ``--events`` runner events already stored, and its
runner's progress object (progress.json, a local file) holding those events. Timed, each a full
``Engine.tick()`` (progress pulls, provider observation, decisions, spend roll-up, budgets):
- first ever: a freshly started engine on jobs it has never read (no ``jobs.progress_window``
  recorded: what the first start after upgrading to migration 0005 meets, once; every progress
  object is read, parsed and checked against the stored events; the first spend roll-up);
- first after a restart: a fresh engine again, now with the reads recorded by the one before it
  (every object is read and hashed; unchanged ones are not parsed; the first spend roll-up);
- steady, quiet: nothing new anywhere;
- steady, reporting: a third of the runners wrote one new progress event since the last tick (the
  runner reports every 30 s and the tick runs every 10 s).
Baseline in the same run, measured right after each quiet tick: the four provider listings alone, and
reading the 10,000 progress objects alone (the I/O floor of any tick); quiet / floor is the ratio of
their medians.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fakes.clouds import FAKES  # noqa: E402
from fakes.clouds.fixtures import client_for  # noqa: E402

from bench.engine_seed import analyze, backend, bench_database, bulk_insert, cloud_fleet  # noqa: E402
from bot.engine.launching.integrity import derive_run_key, master_key  # noqa: E402
from bot.engine.service import Engine  # noqa: E402
from bot.engine.watching.progress import read_raw  # noqa: E402
from bot.settings import Settings  # noqa: E402
from runner.contract.integrity import EVENT, sign  # noqa: E402
from runner.contract.spec import RunnerEvent, progress_uri  # noqa: E402
from store.models import Instance, Job, JobRun, RunnerEventRecord  # noqa: E402

TARGET_S = 2.0
PROFILE_SORT = os.environ.get("TICK_PROFILE_SORT", "tottime")  # with TICK_PROFILE=first|restart|quiet|report
REPEATS = int(os.environ.get("TICK_REPEATS", "3"))


KEYS: dict[str, bytes] = {}  # job id -> the key of its current run (what its runner signs with)


def event(job_id: str, seq: int, ts: float) -> dict:
    """A runner event as the runner writes it: signed with the job's key (runner/contract/integrity.py)."""
    kind = "started" if seq == 0 else "progress"
    return sign(
        KEYS[job_id],
        EVENT,
        RunnerEvent(
            job_id=job_id,
            seq=seq,
            kind=kind,
            step=seq * 10,
            max_steps=10_000,
            loss=2.0 - seq / 1000,
            timestamp=ts,
        ).model_dump(mode="json"),
    )


def write_progress(path: Path, job_id: str, events: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"job_id": job_id, "updated": time.time(), "last_seq": events[-1]["seq"], "events": events[-200:]}
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=None, help="database URL (default: a fresh SQLite file)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=20, help="runner events per job already stored")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tunebot-bench-"))
    db_url = bench_database(args.db, tmp, "tick")
    settings = Settings(
        TUNEBOT_DATA_DIR=str(tmp), TUNEBOT_HEARTBEAT_TIMEOUT=3600, TUNEBOT_IDLE_STOP_MINUTES=120
    )
    fakes = {name: cls(page_size=100).start() for name, cls in FAKES.items()}
    try:
        clients = {name: client_for(fake) for name, fake in fakes.items()}
        engine = Engine(settings, db_url=db_url, providers=clients)
        now = time.time()
        per = args.jobs // len(fakes)
        print(f"building {per * len(fakes)} running jobs, {args.events} events each ...", flush=True)
        progress: dict[str, tuple[Path, list[dict]]] = {}
        runs: list[dict] = []
        master = master_key(engine.ctx)

        def with_progress(job_id: str) -> dict:
            """The job's current run (its own key, as launched since issue 28), the runner's progress
            object for this job, and the job's fields after those events."""
            ckpt = tmp / "jobs" / job_id / "checkpoints"
            run_id, secret = f"run-{job_id}", os.urandom(16).hex()
            runs.append(JobRun(id=run_id, job_id=job_id, secret=secret, created_at=now - 600).model_dump())
            KEYS[job_id] = derive_run_key(master, job_id, run_id, secret)
            evs = [event(job_id, q, now - 600 + q) for q in range(args.events)]
            path = Path(progress_uri(str(ckpt)))
            write_progress(path, job_id, evs)
            progress[job_id] = (path, evs)
            return {
                "max_cost": 1000.0,
                "checkpoint_uri": str(ckpt),
                "last_event_seq": args.events - 1,
                "last_event_at": now - 5,
                "last_step": (args.events - 1) * 10,
                "run_id": run_id,
            }

        jobs, rows = cloud_fleet(fakes, clients, per, now=now - 600, extra=with_progress)
        records = [
            {
                "job_id": job_id,
                "seq": e["seq"],
                "kind": e["kind"],
                "step": e["step"],
                "loss": e["loss"],
                "at": now - 600 + e["seq"],
                "payload": e,
            }
            for job_id, (_, evs) in progress.items()
            for e in evs
        ]
        bulk_insert(engine, Job, jobs)
        bulk_insert(engine, Instance, rows)
        bulk_insert(engine, JobRun, runs)
        bulk_insert(engine, RunnerEventRecord, records)
        analyze(engine)
        n_records = len(records)
        del jobs, rows, records
        runs.clear()
        engine.close()
        # The bench's own data (and the in-process fake clouds' 10,000 instances) would otherwise be
        # traversed by every full garbage collection during the ticks: a bot process holds none of it.
        gc.collect()
        gc.freeze()
        engine = Engine(settings, db_url=db_url, providers=clients)  # a fresh process: nothing remembered

        def tick() -> None:
            assert engine.tick() == per * len(fakes)

        def timed_tick(profile: str) -> float:
            t0 = time.perf_counter()
            if os.environ.get("TICK_PROFILE") == profile:
                import cProfile

                cProfile.runctx("tick()", globals(), {"tick": tick}, sort="cumtime")
            else:
                tick()
            return time.perf_counter() - t0

        first_s = timed_tick("first")
        engine.close()
        engine = Engine(settings, db_url=db_url, providers=clients)  # restarted: a new process again
        restart_s = timed_tick("restart")
        if os.environ.get("TICK_PROFILE") == "quiet":
            import cProfile

            cProfile.runctx("tick()", globals(), locals(), sort=PROFILE_SORT)

        def listings() -> None:
            for client in clients.values():
                client.list_instances()

        def reads() -> None:
            for path, _ in progress.values():
                read_raw(str(path))

        # Each quiet tick is followed by its baseline (the listings, then the reads): the machine's and the
        # fake clouds' drift over the run falls on both sides of the ratio alike.
        quiet, base_lists, base_reads = [], [], []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            tick()
            quiet.append(time.perf_counter() - t0)
            base_lists.append(_timed(listings))
            base_reads.append(_timed(reads))
        reporting = []
        ids = sorted(progress)
        added = 0
        for r in range(REPEATS):
            added += len(ids[r % 3 :: 3])
            for job_id in ids[r % 3 :: 3]:  # a third of the runners report once more
                path, evs = progress[job_id]
                evs.append(event(job_id, evs[-1]["seq"] + 1, time.time()))
                write_progress(path, job_id, evs)
            t0 = time.perf_counter()
            if os.environ.get("TICK_PROFILE") == "report" and r == 0:
                import cProfile

                cProfile.runctx("tick()", globals(), locals(), sort=PROFILE_SORT)
            else:
                tick()
            reporting.append(time.perf_counter() - t0)
        with engine.session() as s:
            states = set(s.execute(select(Job.state).distinct()).scalars())
            stored = s.execute(select(func.count()).select_from(RunnerEventRecord)).scalar_one()
        assert states == {"running"}, states
        assert stored == n_records + added, stored

        base_list, base_read = statistics.median(base_lists), statistics.median(base_reads)
        engine.close()
    finally:
        for fake in fakes.values():
            fake.stop()
    q, rp = statistics.median(quiet), statistics.median(reporting)
    verdict = "PASS" if max(first_s, restart_s, *quiet, *reporting) < TARGET_S else "FAIL"
    n = per * len(fakes)
    print(
        f"tick with {n} running jobs on {len(fakes)} fake clouds ({backend(db_url)}): first ever (no read "
        f"recorded) {first_s * 1000:.0f} ms; first after a restart {restart_s * 1000:.0f} ms; steady quiet "
        f"median {q * 1000:.0f} ms; steady with {n // 3} new runner events median {rp * 1000:.0f} ms "
        f"(target: every tick < {TARGET_S * 1000:.0f} ms, the first ever included) {verdict}"
    )
    print(
        "each tick, s: quiet "
        + " ".join(f"{t:.2f}" for t in quiet)
        + "; reporting "
        + " ".join(f"{t:.2f}" for t in reporting)
        + f" (a full spend roll-up at most every {engine.ctx.limits.rollup_every_s:.0f} s falls in some)"
    )
    print(
        f"baseline, the four provider listings alone: median {base_list * 1000:.0f} ms; reading the {n} "
        f"progress objects alone: median {base_read * 1000:.0f} ms; quiet tick / (listings + reads) = "
        f"{q / (base_list + base_read):.2f}x"
    )


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
