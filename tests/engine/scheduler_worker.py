"""Run by test_scheduler.py: one bot process with a scheduler whose tasks log their runs to a file.

Usage: scheduler_worker.py DB_URL LOG_FILE PERIOD_S LEASE_S
"""

from __future__ import annotations

import os
import sys
import time

from sqlalchemy import create_engine, text

from bot.scheduler import Scheduler, Task


def main() -> None:
    db_url, log_file, period, lease = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])

    db = create_engine(db_url)
    holder = f"{os.getpid()}-worker"

    def task(name: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            # The period this run claimed, as the scheduler committed it before calling us: a period
            # recomputed from the clock here would drift into the next one on a loaded machine.
            with db.connect() as conn:
                key = conn.execute(
                    text(
                        "SELECT period_key FROM task_runs WHERE task = :t AND holder = :h "
                        "ORDER BY id DESC LIMIT 1"
                    ),
                    {"t": name, "h": holder},
                ).scalar_one()
            with open(log_file, "a") as fh:
                fh.write(f"{os.getpid()} {name} {key} {time.time():.3f}\n")

        return run

    tasks = {name: Task(task(name), every_s=period) for name in ("reconcile", "summary")}
    sched = Scheduler(db_url=db_url, tasks=tasks, lease_s=lease, holder=holder)
    sched.start()
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
