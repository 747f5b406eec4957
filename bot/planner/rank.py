"""Cost and ranking of offers: does the job fit, what does it cost in total, which offer to pick.

For every offer: the per-GPU peak memory for its GPU count (plus SAFETY_MARGIN) against the card's
memory; the compute hours at the speed of its GPU type and count; storage for the model download and
two checkpoints while the job runs; egress of the result; and for interruptible offers the expected
preemption overhead with the Young/Daly checkpoint interval (checkpoint cost from the checkpoint size
and DISK_GBS, restart from boot + model download at the host's downlink + checkpoint load).
Numbers depend only on (GPU type, count), so they are computed once per pair and the per-offer work is
vectorized with numpy: ranking 10,000 offers takes a few milliseconds. RankedOffer objects are built
only for the offers returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bot.planner.gpus import GPUS
from bot.planner.offer import Offer
from bot.planner.preemption import expected_wall_hours
from bot.planner.result import RankedOffer

SAFETY_MARGIN = 0.05  # peak memory must fit with 5% to spare
DISK_GBS = 0.5  # checkpoint write/read speed, GB/s (network volumes and NVMe overlays)
CHECKPOINT_FIXED_S = 20.0  # serialization and sync overhead per checkpoint
BOOT_HOURS = 4.0 / 60  # instance boot + image pull
DEFAULT_DOWN_MBPS = 500.0
HOURS_PER_MONTH = 730.0
ON_DEMAND_MTBF_CAP_H = 2.0  # on-demand hosts also fail: checkpoint at least every 1-2 hours
MIN_INTERVAL_H = 5.0 / 60


@dataclass(frozen=True)
class JobShape:
    """What the ranking needs to know about the job, per (GPU type, GPU count)."""

    memory_gb: Callable[[int], float]  # per-GPU peak for a GPU count
    hours: Callable[[str, int], float]  # compute hours on (gpu, count), no preemption
    checkpoint_gb: float
    download_gb: float
    output_gb: float


def rank_offers(
    offers: Sequence[Offer],
    job: JobShape,
    *,
    gpus: int,
    gpu: str | None = None,
    interruptible: bool | None = None,
    max_cost: float | None = None,
    keep_fits: int = 50,
    keep_rejected: int = 50,
) -> tuple[list[RankedOffer], int, int]:
    """(returned offers: fitting ones ranked by total cost, then rejected ones), n_fit, n_rejected."""
    n = len(offers)
    if n == 0:
        return [], 0, 0
    gpu_names = [o.gpu for o in offers]
    counts = np.fromiter((o.gpu_count for o in offers), dtype=np.int64, count=n)
    price = np.fromiter((o.price_per_hour for o in offers), dtype=float, count=n)
    spot = np.fromiter((o.interruptible for o in offers), dtype=bool, count=n)
    rate = np.fromiter((o.preemptions_per_hour for o in offers), dtype=float, count=n)
    storage = np.fromiter((o.storage_per_gb_month for o in offers), dtype=float, count=n)
    egress = np.fromiter((o.egress_per_gb for o in offers), dtype=float, count=n)
    down = np.fromiter((o.inet_down_mbps or DEFAULT_DOWN_MBPS for o in offers), dtype=float, count=n)
    rel = np.fromiter(
        (o.reliability if o.reliability is not None else 0.95 for o in offers), dtype=float, count=n
    )

    # Per (gpu, count) figures, computed once per pair.
    pair_index: dict[tuple[str, int], int] = {}
    pair_of = np.empty(n, dtype=np.int64)
    for i, (g, c) in enumerate(zip(gpu_names, counts.tolist(), strict=True)):
        pair_of[i] = pair_index.setdefault((g, c), len(pair_index))
    cap = np.empty(len(pair_index))
    need = np.empty(len(pair_index))
    work = np.empty(len(pair_index))
    mem_cache: dict[int, float] = {}
    for (g, c), j in pair_index.items():
        if c not in mem_cache:
            mem_cache[c] = job.memory_gb(c)
        need[j] = mem_cache[c]
        known = GPUS.get(g)
        cap[j] = known.memory_gb if known else next(o.gpu_memory_gb for o in offers if o.gpu == g)
        work[j] = job.hours(g, c) if known else np.nan
    cap_o, need_o, work_o = cap[pair_of], need[pair_of], work[pair_of]

    # Checkpointing and preemption.
    ckpt_h = (job.checkpoint_gb / DISK_GBS + CHECKPOINT_FIXED_S) / 3600.0
    restart_h = BOOT_HOURS + job.download_gb * 8000.0 / down / 3600.0 + job.checkpoint_gb / DISK_GBS / 3600.0
    with np.errstate(divide="ignore"):
        od_mtbf = np.where(rel < 1.0, 24.0 / np.maximum(1.0 - rel, 1e-6), np.inf)
        mtbf = np.where(spot & (rate > 0), 1.0 / np.where(rate > 0, rate, 1.0), np.inf)
    interval_mtbf = np.where(np.isfinite(mtbf), mtbf, np.minimum(od_mtbf, ON_DEMAND_MTBF_CAP_H * 10))
    interval = np.sqrt(2.0 * ckpt_h * interval_mtbf)
    interval = np.where(np.isfinite(mtbf), interval, np.minimum(interval, ON_DEMAND_MTBF_CAP_H))
    interval = np.maximum(interval, MIN_INTERVAL_H)
    safe_work = np.nan_to_num(work_o, nan=0.0)
    wall = expected_wall_hours(safe_work, interval, ckpt_h, restart_h, mtbf) + restart_h
    plain_wall = safe_work * (1.0 + ckpt_h / interval) + restart_h
    compute_cost = plain_wall * price
    preempt_cost = np.maximum(wall - plain_wall, 0.0) * price
    disk_gb = job.download_gb + 2.0 * job.checkpoint_gb
    storage_cost = disk_gb * storage * wall / HOURS_PER_MONTH
    egress_cost = job.output_gb * egress
    total = compute_cost + preempt_cost + storage_cost + egress_cost

    fits = (need_o * (1.0 + SAFETY_MARGIN) <= cap_o) & np.isfinite(work_o)
    eligible = np.ones(n, dtype=bool)
    reasons: dict[int, str] = {}
    wrong_count = counts != gpus
    wrong_gpu = np.array([g != gpu for g in gpu_names]) if gpu else np.zeros(n, dtype=bool)
    wrong_class = (spot != interruptible) if interruptible is not None else np.zeros(n, dtype=bool)
    over_budget = total > max_cost if max_cost is not None else np.zeros(n, dtype=bool)
    ok = fits & ~wrong_count & ~wrong_gpu & ~wrong_class & ~over_budget
    eligible = ok

    fit_idx = np.flatnonzero(eligible)
    fit_idx = fit_idx[np.argsort(total[fit_idx], kind="stable")]
    labels: dict[int, list[str]] = {}
    if fit_idx.size:
        labels.setdefault(int(fit_idx[0]), []).append("cheapest")
        fastest = fit_idx[np.lexsort((total[fit_idx], wall[fit_idx]))[0]]
        labels.setdefault(int(fastest), []).append("fastest")
        # Safest: on-demand first, then the most reliable host, then the cheapest.
        safest = fit_idx[np.lexsort((total[fit_idx], -rel[fit_idx], spot[fit_idx]))[0]]
        labels.setdefault(int(safest), []).append("safest")
    keep = list(fit_idx[:keep_fits]) + [i for i in labels if i not in set(fit_idx[:keep_fits].tolist())]

    rej_idx = np.flatnonzero(~eligible)
    rej_idx = rej_idx[
        np.argsort(
            need_o[rej_idx] / cap_o[rej_idx] + wrong_count[rej_idx] + wrong_gpu[rej_idx], kind="stable"
        )
    ]
    seen: set[tuple] = set()
    rejected: list[int] = []
    for i in rej_idx.tolist():
        o = offers[i]
        key = (o.provider, o.gpu, o.gpu_count, o.interruptible)
        if key in seen:
            continue
        seen.add(key)
        if not np.isfinite(work_o[i]):
            reasons[i] = f"unknown GPU type {o.gpu!r}: no speed figures"
        elif wrong_gpu[i]:
            reasons[i] = f"not the requested GPU ({gpu})"
        elif wrong_count[i]:
            reasons[i] = f"{o.gpu_count} GPUs; the request is for {gpus} (use --gpus {o.gpu_count})"
        elif not fits[i]:
            reasons[i] = (
                f"needs {need_o[i]:.1f} GB per GPU (+{SAFETY_MARGIN:.0%} margin); "
                f"{o.gpu} has {cap_o[i]:.1f} GB"
            )
        elif wrong_class[i]:
            reasons[i] = "interruptible" if spot[i] else "on-demand"
            reasons[i] += " (excluded by --interruptible/--on-demand)"
        else:
            reasons[i] = f"expected ${total[i]:.2f} is above the cost limit ${max_cost:.2f}"
        rejected.append(i)
        if len(rejected) >= keep_rejected:
            break

    out: list[RankedOffer] = []
    for i in keep + rejected:
        o = offers[i]
        is_fit = bool(eligible[i])
        if is_fit:
            lab = labels.get(i, [])
            reason = ("recommended: " + ", ".join(lab)) if lab else "fits"
            if spot[i]:
                reason += f"; checkpoint every {interval[i] * 60:.0f} min against {rate[i]:.2f} preemptions/h"
        else:
            reason = reasons[i]
        out.append(
            RankedOffer(
                provider=o.provider,
                offer_id=o.offer_id,
                gpu=o.gpu,
                gpu_count=o.gpu_count,
                gpu_memory_gb=o.gpu_memory_gb,
                interruptible=o.interruptible,
                price_per_hour=o.price_per_hour,
                hours=round(float(wall[i]), 4),
                total_cost=round(float(total[i]), 4),
                compute_cost=round(float(compute_cost[i]), 4),
                storage_cost=round(float(storage_cost[i]), 4),
                egress_cost=round(float(egress_cost[i]), 4),
                preemption_cost=round(float(preempt_cost[i]), 4),
                checkpoint_minutes=round(float(interval[i] * 60), 1),
                fits=is_fit,
                reason=reason,
                labels=labels.get(i, []) if is_fit else [],
                reliability=o.reliability,
                source=o.source,
            )
        )
    return out, int(fit_idx.size), int(n - fit_idx.size)
