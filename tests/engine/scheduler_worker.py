"""Run by test_scheduler.py: one bot process with a scheduler whose tasks log their runs to a file.

Usage: scheduler_worker.py DB_URL LOG_FILE PERIOD_S LEASE_S
"""

from __future__ import annotations

import os
import sys
import time

from bot.scheduler import Scheduler, Task


def main() -> None:
    db_url, log_file, period, lease = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])

    def task(name: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            with open(log_file, "a") as fh:
                now = time.time()
                fh.write(f"{os.getpid()} {name} {int(now // period)} {now:.3f}\n")

        return run

    tasks = {name: Task(task(name), every_s=period) for name in ("reconcile", "summary")}
    sched = Scheduler(db_url=db_url, tasks=tasks, lease_s=lease)
    sched.start()
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
