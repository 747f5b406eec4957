"""`tunebot gpus --live` with one cloud stalling 10 s per call: target < 12 s; and requests per URL.

Usage: .venv/bin/python bench/catalog_live.py [--stall runpod] [--stall-s 10]
The four fake clouds run on 127.0.0.1; one of them (RunPod by default) answers every request after
``--stall-s`` seconds. Measured, each on fresh fakes:
- this build: `tunebot gpus --live` as a whole process (cold: interpreter start, imports, first
  listing; keys and URLs from the environment, clients paced by each cloud's documented rate);
- this build in-process: `live_catalog()` cold and warm (the TTL cache), with all clouds healthy;
- baseline, the listing before issue 12: a thread per cloud, each GPU count asked in turn at every
  cloud (the same URL again where a cloud lists all sizes at one URL), no overall deadline.
Printed: wall times, which clouds answered live, and the requests each fake saw per distinct request.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes.clouds import FAKES  # noqa: E402

from bot.providers import catalog  # noqa: E402
from bot.providers.base import OfferQuery  # noqa: E402
from bot.providers.registry import cloud_spec  # noqa: E402

TARGET_S = 12.0


def start_fakes(stall: str | None, stall_s: float) -> dict:
    fakes = {name: cls().start() for name, cls in FAKES.items()}
    if stall:
        fakes[stall].delay_s = stall_s
    return fakes


def env_for(fakes: dict) -> dict[str, str]:
    env = dict(os.environ)
    for name, fake in fakes.items():
        spec = cloud_spec(name)
        env[spec.key_env], env[spec.url_env] = fake.api_key, fake.url
    return env


def requests_seen(fakes: dict) -> str:
    parts = []
    for name, fake in fakes.items():
        asked = fake.per_request("search")
        most = max(asked.values(), default=0)
        parts.append(f"{name} {sum(asked.values())} requests / {len(asked)} distinct (max {most}x)")
    return "; ".join(parts)


def stop(fakes: dict) -> None:
    for fake in fakes.values():
        fake.stop()


def old_listing(fakes: dict) -> float:
    """The pre-issue-12 listing: per cloud, the four GPU-count queries one after another, no deadline."""
    clients = {
        n: cloud_spec(n).client(api_key=f.api_key, base_url=f.url, timeout_s=30.0) for n, f in fakes.items()
    }

    def ask(client):  # type: ignore[no-untyped-def]
        return [o for n in catalog.GPU_COUNTS for o in client.search_offers(OfferQuery(gpu_count=n))]

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        list(pool.map(ask, clients.values()))
    return time.perf_counter() - started


def cli_listing(fakes: dict) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "bot.cli", "gpus", "--live"],
        env=env_for(fakes),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - started
    notes = [line.strip() for line in (out.stdout + out.stderr).splitlines() if "snapshot (" in line]
    return wall, " | ".join(notes) or "(no snapshot notes: every cloud answered live)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stall", default="runpod", choices=sorted(FAKES))
    parser.add_argument("--stall-s", type=float, default=10.0)
    args = parser.parse_args()
    print(f"{args.stall} stalls {args.stall_s:g} s on every request; the other clouds answer at once")

    fakes = start_fakes(args.stall, args.stall_s)
    try:
        wall, notes = cli_listing(fakes)
        seen = requests_seen(fakes)
    finally:
        stop(fakes)
    verdict = "PASS" if wall < TARGET_S else "FAIL"
    print(
        f"this build, `tunebot gpus --live` (whole process, cold): {wall:6.2f} s  "
        f"(target < {TARGET_S:g} s: {verdict})"
    )
    print(f"  notes: {notes}")
    print(f"  requests: {seen}")

    fakes = start_fakes(args.stall, args.stall_s)
    try:
        old = old_listing(fakes)
        seen = requests_seen(fakes)
    finally:
        stop(fakes)
    print(
        f"baseline, sequential per-count listing, no deadline:       {old:6.2f} s  "
        f"({old / wall:.1f}x this build)"
    )
    print(f"  requests: {seen}")

    fakes = start_fakes(None, 0.0)
    try:
        os.environ.update(env_for(fakes))
        from bot.settings import get_settings

        get_settings.cache_clear()
        catalog.clear_cache()
        started = time.perf_counter()
        cat = catalog.live_catalog()
        cold = time.perf_counter() - started
        started = time.perf_counter()
        catalog.live_catalog()
        warm = time.perf_counter() - started
        seen = requests_seen(fakes)
        catalog.clear_cache()
        old = old_listing(fakes)
    finally:
        stop(fakes)
    print(
        f"all clouds healthy, in-process live_catalog(): cold {cold * 1000:.0f} ms, "
        f"warm (cache) {warm * 1000:.1f} ms; "
        f"baseline {old * 1000:.0f} ms; {len(cat.offers)} offers, live: {', '.join(cat.live_providers)}"
    )
    print(f"  requests (cold + warm): {seen}")


if __name__ == "__main__":
    main()
