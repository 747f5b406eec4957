"""Cost and ranking of offers: does the job fit, what does it cost in total, which offer to pick.

For every offer: the per-GPU peak memory for its GPU count (plus SAFETY_MARGIN) against the card's
memory; the compute hours at the speed of its GPU type and count; storage for the model download and
two checkpoints while the job runs (the disk a launch asks for, where the job says: bot/planner/disk.py);
whether the offer's disk can hold it; egress of the result; and for interruptible offers the expected
preemption overhead with the Young/Daly checkpoint interval (checkpoint cost from the checkpoint size
and DISK_GBS, restart from boot (the offer's own boot time where it has one) + model download at the
host's downlink + checkpoint load).
Memory and hours depend only on (GPU type, count), so they are computed once per pair. The per-offer
formulas run once over numpy arrays for large lists (10,000 offers in a few milliseconds) and on
plain floats for small ones (no numpy import on the CLI path). RankedOffer objects are built only for
the offers returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.planner.gpus import known as known_device
from bot.planner.offer import Offer
from bot.planner.preemption import ScalarMath, expected_wall_hours
from bot.planner.result import RankedOffer

SAFETY_MARGIN = 0.05  # peak memory must fit with 5% to spare
TIGHT_SHARE = 0.90  # a fitting offer whose top of the memory range passes 90% of the card is flagged tight
DISK_GBS = 0.5  # checkpoint write/read speed, GB/s (network volumes and NVMe overlays)
CHECKPOINT_FIXED_S = 20.0  # serialization and sync overhead per checkpoint
BOOT_HOURS = 4.0 / 60  # instance boot + image pull, for offers that do not say
DEFAULT_DOWN_MBPS = 500.0
DEFAULT_RELIABILITY = 0.95
HOURS_PER_MONTH = 730.0
ON_DEMAND_MAX_INTERVAL_H = 2.0  # on-demand hosts fail too: checkpoint at least every 2 hours
MIN_INTERVAL_H = 5.0 / 60
VECTOR_MIN = 256  # from this many offers on, use numpy
REJECTED_BY = {1: "memory", 2: "budget", 3: "class", 4: "gpu_count", 5: "gpu", 6: "unknown_gpu", 7: "disk"}
REJECTION_ORDER = (1, 7, 2, 3, 4, 5, 6)  # which rejected offers are listed first (up to keep_rejected)

# What each label means, as a sort key over (expected total $, wall hours, interruptible, reliability):
# the offer with the smallest key gets the label. Safest: on-demand first, then the most reliable host,
# then the cheapest. The engine applies the same keys to the offers it can launch (bot/engine/offers.py).
LABEL_KEYS: dict[str, Callable[[float, float, bool, float], tuple]] = {
    "cheapest": lambda total, hours, spot, rel: (total,),
    "fastest": lambda total, hours, spot, rel: (hours, total),
    "safest": lambda total, hours, spot, rel: (spot, -rel, total),
}


@dataclass(frozen=True)
class JobShape:
    """What the ranking needs to know about the job."""

    memory_gb: Callable[[int], float]  # per-GPU peak for a GPU count
    hours: Callable[[str, int], float]  # compute hours on (gpu, count), no preemption
    checkpoint_gb: float
    download_gb: float
    output_gb: float
    memory_on: Callable[[str, int], float] | None = None  # per (gpu, count) when a calibration moves it
    memory_upper: float = 1.0  # the upper end of the memory range, as a ratio: what "fits" is judged on
    memory_lower: float = 1.0  # the lower end, shown with it ("needs 18-22 GB of 24")
    hours_low_high: tuple[float, float] = (1.0, 1.0)  # the compute-time range as ratios (cost ranges)
    disk_gb: float = 0.0  # the disk a launch asks for (0: not sized: storage on download + checkpoints)

    @property
    def checkpoint_hours(self) -> float:
        return (self.checkpoint_gb / DISK_GBS + CHECKPOINT_FIXED_S) / 3600.0

    def restart_hours(self, down_mbps: Any, boot_hours: Any = BOOT_HOURS) -> Any:
        return (
            boot_hours
            + self.download_gb * 8000.0 / down_mbps / 3600.0
            + self.checkpoint_gb / DISK_GBS / 3600.0
        )


def offer_costs(
    xp: Any, job: JobShape, work, price, spot, rate, storage, egress, down, rel, boot
) -> dict[str, Any]:
    """The cost formulas for one offer (floats, xp=ScalarMath) or many (numpy arrays, xp=numpy)."""
    ckpt_h = job.checkpoint_hours
    restart_h = job.restart_hours(down, boot)
    preemptible = spot * (rate > 0)
    mtbf = xp.where(preemptible, 1.0 / xp.maximum(rate, 1e-12), float("inf"))
    od_mtbf = 24.0 / xp.maximum(1.0 - rel, 1e-6)  # a host failure per (1 - reliability) days
    interval = xp.sqrt(2.0 * ckpt_h * xp.where(preemptible, mtbf, od_mtbf))
    interval = xp.maximum(
        xp.where(preemptible, interval, xp.minimum(interval, ON_DEMAND_MAX_INTERVAL_H)), MIN_INTERVAL_H
    )
    wall = expected_wall_hours(work, interval, ckpt_h, restart_h, mtbf, xp) + restart_h
    plain = work * (1.0 + ckpt_h / xp.maximum(xp.minimum(interval, work), 1e-9)) + restart_h
    compute = plain * price
    preempt = xp.maximum(wall - plain, 0.0) * price
    stored_gb = max(job.disk_gb, job.download_gb + 2.0 * job.checkpoint_gb)  # billed on the disk asked for
    storage_cost = stored_gb * storage * wall / HOURS_PER_MONTH
    egress_cost = job.output_gb * egress
    return {
        "interval": interval,
        "wall": wall,
        "compute": compute,
        "preempt": preempt,
        "storage": storage_cost,
        "egress": egress_cost,
        "total": compute + preempt + storage_cost + egress_cost,
    }


_FIELDS = (
    "price_per_hour",
    "interruptible",
    "preemptions_per_hour",
    "storage_per_gb_month",
    "egress_per_gb",
    "inet_down_mbps",
    "reliability",
    "gpu",
    "gpu_count",
    "boot_minutes",
    "max_disk_gb",
)


def _columns(offers: Sequence[Offer]) -> dict[str, list]:
    """Offer attributes as columns, read from each model's field dict (4x faster than getattr)."""
    rows = [o.__dict__ for o in offers]
    col = {f: [r[f] for r in rows] for f in _FIELDS}
    return {
        "price": col["price_per_hour"],
        "spot": col["interruptible"],
        "rate": col["preemptions_per_hour"],
        "storage": col["storage_per_gb_month"],
        "egress": col["egress_per_gb"],
        "down": [d or DEFAULT_DOWN_MBPS for d in col["inet_down_mbps"]],
        "rel": [DEFAULT_RELIABILITY if r is None else r for r in col["reliability"]],
        "boot": [BOOT_HOURS if b is None else b / 60.0 for b in col["boot_minutes"]],
        "gpu": col["gpu"],
        "count": col["gpu_count"],
        "disk": col["max_disk_gb"],
    }


def _cost_range(total: float, egress: float, low_high: tuple[float, float]) -> list[float] | None:
    """Everything but egress scales with the hours the job runs (compute, preemption overhead, storage)."""
    if low_high == (1.0, 1.0):
        return None
    return [round(egress + (total - egress) * r, 4) for r in low_high]


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
    """(fitting offers ranked by expected total cost, then rejected ones with reasons), n_fit, n_rejected."""
    n = len(offers)
    if n == 0:
        return [], 0, 0
    # Per (gpu, count): memory need, card memory, compute hours.
    cols = _columns(offers)
    gpu_col, count_col, disk_col = cols.pop("gpu"), cols.pop("count"), cols.pop("disk")
    keys = list(zip(gpu_col, count_col, strict=True))
    pairs: dict[tuple[str, int], tuple[float, float, float | None]] = {}
    mem_cache: dict[int, float] = {}
    for i, key in enumerate(keys):
        if key in pairs:
            continue
        g, c = key
        if job.memory_on is not None:
            need = job.memory_on(g, c)
        else:
            if c not in mem_cache:
                mem_cache[c] = job.memory_gb(c)
            need = mem_cache[c]
        device = known_device(g)
        cap = device.memory_gb if device and device.memory_gb else offers[i].gpu_memory_gb
        pairs[key] = (need, cap, job.hours(g, c) if device else None)
    per = [pairs[k] for k in keys]
    work = [p[2] if p[2] is not None else 0.0 for p in per]
    if n >= VECTOR_MIN:
        import numpy as np

        arr = {k: np.asarray(v, dtype=bool if k == "spot" else float) for k, v in cols.items()}
        res = offer_costs(np, job, np.asarray(work), **arr)
        res = {k: np.broadcast_to(v, (n,)) for k, v in res.items()}  # indexed only for returned offers
    else:
        rows = [offer_costs(ScalarMath, job, work[i], **{k: v[i] for k, v in cols.items()}) for i in range(n)]
        res = {k: [r[k] for r in rows] for k in rows[0]}
    if n >= VECTOR_MIN:
        total, wall = res["total"].tolist(), res["wall"].tolist()
    else:
        total, wall = res["total"], res["wall"]

    # Eligibility, with the first reason that applies.
    # Category per (gpu, count) first (cheap), then per offer only for class and budget.
    pair_cat: dict[tuple[str, int], int] = {}
    for (g, c), (need, cap, hours) in pairs.items():
        if hours is None:
            pair_cat[(g, c)] = 6
        elif gpu and g != gpu:
            pair_cat[(g, c)] = 5
        elif c != gpus:
            pair_cat[(g, c)] = 4
        elif need * job.memory_upper * (1.0 + SAFETY_MARGIN) > cap:
            pair_cat[(g, c)] = 1
        else:
            pair_cat[(g, c)] = 0
    # 0 fits; 1 memory; 2 budget; 3 class; 4 count; 5 gpu; 6 unknown; 7 disk
    category = [pair_cat[k] for k in keys]
    spot_col = cols["spot"]
    for i, cat in enumerate(category):
        if cat == 0:
            if interruptible is not None and spot_col[i] != interruptible:
                category[i] = 3
            elif disk_col[i] is not None and disk_col[i] < job.disk_gb:
                category[i] = 7
            elif max_cost is not None and total[i] > max_cost:
                category[i] = 2
    fit_idx = sorted((i for i in range(n) if category[i] == 0), key=total.__getitem__)
    labels: dict[int, list[str]] = {}
    if fit_idx:
        rel_col = cols["rel"]
        for name, sort_key in LABEL_KEYS.items():
            best = min(fit_idx, key=lambda i: sort_key(total[i], wall[i], spot_col[i], rel_col[i]))
            labels.setdefault(best, []).append(name)
    keep = fit_idx[:keep_fits]
    keep += [i for i in labels if i not in set(keep)]

    rejected: list[int] = []
    seen: set[tuple] = set()
    buckets: dict[int, list[int]] = {}
    for i, cat in enumerate(category):
        if cat:
            buckets.setdefault(cat, []).append(i)
    if 1 in buckets:  # memory rejections: the nearest misses first
        buckets[1].sort(key=lambda i: per[i][0] / per[i][1])
    for cat in sorted(buckets, key=REJECTION_ORDER.index):  # the nearest misses first
        for i in buckets[cat]:
            o = offers[i]
            key = (o.provider, o.gpu, o.gpu_count, o.interruptible)
            if key not in seen:
                seen.add(key)
                rejected.append(i)
                if len(rejected) >= keep_rejected:
                    break
        if len(rejected) >= keep_rejected:
            break

    def reason(i: int) -> str:
        o, (need, cap, _) = offers[i], per[i]
        cat = category[i]
        if cat == 0:
            lab = labels.get(i, [])
            text = ("recommended: " + ", ".join(lab)) if lab else "fits"
            text += f" ({need:.1f} of {cap:.1f} GB per GPU"
            text += f", up to {need * job.memory_upper:.1f})" if job.memory_upper > 1.0 else ")"
            if o.interruptible:
                minutes = float(res["interval"][i]) * 60
                text += (
                    f"; checkpoint every {minutes:.0f} min against {o.preemptions_per_hour:.2f} preemptions/h"
                )
            return text
        if cat == 1:
            upper = f", up to {need * job.memory_upper:.1f}" if job.memory_upper > 1.0 else ""
            margin = f"+{SAFETY_MARGIN:.0%} margin"
            return f"needs {need:.1f} GB per GPU{upper} ({margin}); {o.gpu} has {cap:.1f} GB"
        if cat == 2:
            return f"expected ${total[i]:.2f} is above the cost limit ${max_cost:.2f}"
        if cat == 3:
            return (
                "interruptible" if o.interruptible else "on-demand"
            ) + " (excluded by interruptible=yes|no)"
        if cat == 4:
            return f"{o.gpu_count} GPUs; the request is for {gpus} (use gpus={o.gpu_count})"
        if cat == 5:
            return f"not the requested GPU ({gpu})"
        if cat == 7:
            return f"needs {job.disk_gb:.0f} GB of disk; this host offers at most {disk_col[i]:.0f} GB"
        return f"unknown GPU type {o.gpu!r}: no speed figures"

    out: list[RankedOffer] = []
    for i in keep + rejected:
        o = offers[i]
        out.append(
            RankedOffer(
                provider=o.provider,
                offer_id=o.offer_id,
                gpu=o.gpu,
                gpu_count=o.gpu_count,
                gpu_memory_gb=o.gpu_memory_gb,
                interruptible=o.interruptible,
                price_per_hour=o.price_per_hour,
                hours=round(wall[i], 4),
                total_cost=round(total[i], 4),
                compute_cost=round(float(res["compute"][i]), 4),
                storage_cost=round(float(res["storage"][i]), 4),
                egress_cost=round(float(res["egress"][i]), 4),
                preemption_cost=round(float(res["preempt"][i]), 4),
                total_cost_range=_cost_range(total[i], float(res["egress"][i]), job.hours_low_high),
                memory_need_gb=[round(per[i][0] * r, 2) for r in (job.memory_lower, job.memory_upper)],
                memory_capacity_gb=round(per[i][1], 2),
                memory_tight=category[i] == 0 and per[i][0] * job.memory_upper > TIGHT_SHARE * per[i][1],
                checkpoint_minutes=round(float(res["interval"][i]) * 60, 1),
                max_disk_gb=disk_col[i],
                fits=category[i] == 0,
                rejected_by=REJECTED_BY.get(category[i]),
                reason=reason(i),
                labels=labels.get(i, []) if category[i] == 0 else [],
                reliability=o.reliability,
                source=o.source,
            )
        )
    return out, len(fit_idx), n - len(fit_idx)
