"""Resident memory of the bot after 2,000 `/tune estimate` commands through the chat handler: target < 250 MB.

Usage: .venv/bin/python bench/bot_rss.py [--n 2000]
The four fake clouds run in this process; each measured bot is a fresh child process (`tunebot serve`'s
pieces: the real Engine on SQLite with the four clouds' keys pointing at the fakes, live catalog, real
planner, ChatHandlers) that runs N estimate commands, each with a different token count, the first one
cold (first imports, first live listing, first planner caches). Printed per child: RSS after start-up,
after the first estimate, and after 100 / 1,000 / N commands.
Baseline in the same run: the old store, which kept every whole Estimate object (reproduced by keeping
each estimate the handler made beside the new store, bounded at 2,000 like the old one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

TARGET_MB = 250.0
COMMAND = "estimate meta-llama/Llama-3.1-8B method=lora tokens={tokens}"


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def child(mode: str, n: int) -> None:
    from bot.chat.handlers import Actor, ChatHandlers
    from bot.chat.permissions import Permissions
    from bot.engine.service import Engine
    from bot.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="tunebot-rss-"))
    engine = Engine(Settings(TUNEBOT_DATA_DIR=str(tmp)), db_url=f"sqlite:///{tmp / 'db.sqlite'}")
    chat = ChatHandlers(engine, Permissions())
    old_store: OrderedDict[int, object] = OrderedDict()
    if mode == "full":  # the old EstimateStore: every whole Estimate, up to 2,000
        made = engine.estimate
        ids = itertools.count()

        def keep_whole(request):  # type: ignore[no-untyped-def]
            est = made(request)
            old_store[next(ids)] = est
            while len(old_store) > 2000:
                old_store.popitem(last=False)
            return est

        engine.estimate = keep_whole  # type: ignore[method-assign]
    marks = {"start": rss_mb()}
    actor = Actor("U_BENCH", "C_BENCH")
    started = time.perf_counter()
    first_s = 0.0
    for i in range(n):
        reply = chat.handle_text(COMMAND.format(tokens=1_000_000 + i), actor)
        if i == 0:
            first_s = time.perf_counter() - started
            assert "Offers ranked" in str(reply.parts), reply.fallback
            marks["after the first (cold) estimate"] = rss_mb()
        if i + 1 in (100, 1000):
            marks[f"after {i + 1}"] = rss_mb()
    marks[f"after {n}"] = rss_mb()
    total_s = time.perf_counter() - started
    offers = len(next(iter(chat.store._items.values())).estimate.offers)
    print(json.dumps({"marks": marks, "first_s": first_s, "total_s": total_s, "launchable_kept": offers}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--child", choices=("new", "full"))
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n)
        return
    from fakes.clouds import FAKES

    from bot.providers.registry import cloud_spec

    fakes = {name: cls().start() for name, cls in FAKES.items()}
    env = dict(os.environ)
    for name, fake in fakes.items():
        spec = cloud_spec(name)
        env[spec.key_env], env[spec.url_env] = fake.api_key, fake.url
    env["TUNEBOT_LOCAL_PROVIDER"] = "false"
    results = {}
    try:
        for mode in ("new", "full"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--n", str(args.n)],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for fake in fakes.values():
            fake.stop()
    print(f"{args.n} estimate commands via ChatHandlers; real Engine, 4 fake clouds (live); fresh processes")
    labels = list(results["new"]["marks"])
    print(f"{'RSS (MB)':34s} {'baseline: whole Estimates':>26s} {'this build':>12s}")
    for label in labels:
        print(f"{label:34s} {results['full']['marks'][label]:26.1f} {results['new']['marks'][label]:12.1f}")
    new_end = results["new"]["marks"][labels[-1]]
    full_end = results["full"]["marks"][labels[-1]]
    per_new = (new_end - results["new"]["marks"][labels[1]]) / max(1, args.n - 1) * 1000
    per_full = (full_end - results["full"]["marks"][labels[1]]) / max(1, args.n - 1) * 1000
    print(f"growth per estimate: baseline {per_full:.0f} KB, this build {per_new:.1f} KB")
    new = results["new"]
    print(
        f"first (cold) estimate {new['first_s']:.2f} s; all {args.n}: {new['total_s']:.1f} s;"
        f" fitting offers kept per estimate: {new['launchable_kept']}"
    )
    verdict = "PASS" if new_end < TARGET_MB else "FAIL"
    print(
        f"RSS after {args.n}: {new_end:.1f} MB "
        f"(target < {TARGET_MB:.0f} MB: {verdict}; baseline {full_end:.1f} MB)"
    )


if __name__ == "__main__":
    main()
