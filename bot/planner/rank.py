"""Cost and ranking of offers: does the job fit, what does it cost in total, which offer to pick.

For every offer: the per-GPU peak memory for its GPU count (plus SAFETY_MARGIN) against the card's
memory; the whole run's hours by phase (bot/planner/phases.py): the runner's work at the speed of its GPU
type and count, the offer's start (its boot, or the planner's default, with the runner's imports, or a
fork where the local provider keeps a prewarmed process), the model's download at the host's downlink and
the runner's timed checkpoint saves (one each interval of the training loop, none in a shorter run);
storage for the model download and two checkpoints while the job runs (the disk a launch asks for, where
the job says: bot/planner/disk.py); whether the offer's disk can hold it; egress of the result; and for
interruptible offers the expected preemption overhead with the Young/Daly checkpoint interval (checkpoint
cost from the checkpoint size, restart from boot + model download + checkpoint load).
Memory and hours depend only on (GPU type, count), so they are computed once per pair. The per-offer
formulas run once over numpy arrays for large lists (10,000 offers in a few milliseconds) and on
plain floats for small ones (no numpy import on the CLI path). RankedOffer objects are built only for
the offers returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.money import money
from bot.planner.gpus import known as known_device
from bot.planner.offer import Offer
from bot.planner.phases import offer_phases
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
# Why an offer is or is not eligible; the first that applies wins (rank_offers' categories).
FITS, MEMORY, BUDGET, CLASS, GPU_COUNT, OTHER_GPU, UNKNOWN_GPU, DISK = range(8)
REJECTED_BY = {
    MEMORY: "memory",
    BUDGET: "budget",
    CLASS: "class",
    GPU_COUNT: "gpu_count",
    OTHER_GPU: "gpu",
    UNKNOWN_GPU: "unknown_gpu",
    DISK: "disk",
}
# which rejected offers are listed first (up to keep_rejected)
REJECTION_ORDER = (MEMORY, DISK, BUDGET, CLASS, GPU_COUNT, OTHER_GPU, UNKNOWN_GPU)

# What each label means, as a sort key over (expected total $, wall hours, interruptible, reliability):
# the offer with the smallest key gets the label. Safest: on-demand first, then the most reliable host,
# then the cheapest. The engine applies the same keys to the offers it can launch
# (bot/engine/launching/offers.py).
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
    # By phase (bot/planner/phases.py): the runner's phases on (gpu, count) in seconds, its training loop's
    # hours (what the timed saves run on), the runner process's start on a GPU type (warm: forked from a
    # prewarmed process) and one checkpoint save there, in hours. None: hand-made shapes (tests), priced
    # by ``hours`` and the fixed checkpoint cost alone.
    phases: Callable[[str, int], dict[str, float]] | None = None
    loop_hours: Callable[[str, int], float] | None = None
    import_hours: Callable[[str, bool], float] | None = None
    save_hours: Callable[[str], float] | None = None

    @property
    def checkpoint_hours(self) -> float:
        return (self.checkpoint_gb / DISK_GBS + CHECKPOINT_FIXED_S) / 3600.0

    def download_hours(self, down_mbps: Any) -> Any:
        return self.download_gb * 8000.0 / down_mbps / 3600.0

    def restart_hours(self, down_mbps: Any, boot_hours: Any = BOOT_HOURS) -> Any:
        return boot_hours + self.download_hours(down_mbps) + self.checkpoint_gb / DISK_GBS / 3600.0


def offer_costs(
    xp: Any, job: JobShape, work, price, spot, rate, storage, egress, down, rel, boot, ckpt=None, loop=None
) -> dict[str, Any]:
    """The cost formulas for one offer (floats, xp=ScalarMath) or many (numpy arrays, xp=numpy). ``boot``:
    the hours until the runner's first phase (the runner's imports included where the job prices them);
    ``ckpt``: one checkpoint save's hours there; ``loop``: the training loop's hours (the timed saves)."""
    ckpt_h = job.checkpoint_hours if ckpt is None else ckpt
    loop_h = work if loop is None else loop
    restart_h = job.restart_hours(down, boot)
    start_h = boot + job.download_hours(down)  # the first start loads no checkpoint
    preemptible = spot * (rate > 0)
    mtbf = xp.where(preemptible, 1.0 / xp.maximum(rate, 1e-12), float("inf"))
    od_mtbf = 24.0 / xp.maximum(1.0 - rel, 1e-6)  # a host failure per (1 - reliability) days
    interval = xp.sqrt(2.0 * ckpt_h * xp.where(preemptible, mtbf, od_mtbf))
    interval = xp.maximum(
        xp.where(preemptible, interval, xp.minimum(interval, ON_DEMAND_MAX_INTERVAL_H)), MIN_INTERVAL_H
    )
    # The runner saves every interval of its training loop, not at its end (the output is saved then): none in
    # a loop shorter than the interval.
    saves = xp.floor(loop_h / xp.maximum(interval, 1e-9))
    plain = work + saves * ckpt_h + start_h
    wall = xp.where(
        preemptible, expected_wall_hours(work, interval, ckpt_h, restart_h, mtbf, xp) + start_h, plain
    )
    compute = plain * price
    preempt = xp.maximum(wall - plain, 0.0) * price
    stored_gb = max(job.disk_gb, job.download_gb + 2.0 * job.checkpoint_gb)  # billed on the disk asked for
    storage_cost = stored_gb * storage * wall / HOURS_PER_MONTH
    egress_cost = job.output_gb * egress
    return {
        "interval": interval,
        "saves": saves,
        "ckpt": ckpt_h,
        "start": start_h,
        "wall": wall,
        "compute": compute,
        "preempt": preempt,
        "plain": plain,
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
    "warm_start",
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
        "warm": col["warm_start"],
        "gpu": col["gpu"],
        "count": col["gpu_count"],
        "disk": col["max_disk_gb"],
    }


def _dollars(amount: float) -> float:
    """To a millionth of a dollar: a tiny CPU job's $0.00004 stays what it is (bot/money.py writes it), where
    four decimals made it $0.00 on one door and $0.0001 on another."""
    return round(amount, 6)


def _cost_range(total: float, egress: float, low_high: tuple[float, float]) -> list[float] | None:
    """Everything but egress scales with the hours the job runs (compute, preemption overhead, storage)."""
    if low_high == (1.0, 1.0):
        return None
    return [_dollars(egress + (total - egress) * r) for r in low_high]


PairKey = tuple[str, int]  # (GPU type, GPU count)
# (memory need per GPU, card memory, compute hours; None: an unknown GPU)
Pair = tuple[float, float, float | None]


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
    cols = _columns(offers)
    gpu_col, count_col, disk_col = cols.pop("gpu"), cols.pop("count"), cols.pop("disk")
    warm_col = cols.pop("warm")
    keys = list(zip(gpu_col, count_col, strict=True))
    pairs = _pair_figures(offers, keys, job)
    per = [pairs[k] for k in keys]
    _by_phase(job, cols, keys, gpu_col, warm_col, per)
    costs = _costs(job, cols, [p[2] if p[2] is not None else 0.0 for p in per])
    pair_cat = {key: _pair_category(pair, key, job, gpus=gpus, gpu=gpu) for key, pair in pairs.items()}
    category = _offer_categories(
        [pair_cat[k] for k in keys],
        cols["spot"],
        disk_col,
        costs.total,
        job,
        interruptible=interruptible,
        max_cost=max_cost,
    )
    fit_idx = sorted((i for i in range(n) if category[i] == FITS), key=costs.total.__getitem__)
    labels = _labels(fit_idx, costs, cols["spot"], cols["rel"])
    keep = fit_idx[:keep_fits]
    keep += [i for i in labels if i not in set(keep)]
    rejected = _rejections_shown(offers, category, per, keep_rejected)
    table = _Table(offers, job, per, category, labels, costs, disk_col, gpus=gpus, gpu=gpu, max_cost=max_cost)
    return [table.ranked(i) for i in keep + rejected], len(fit_idx), n - len(fit_idx)


def _by_phase(
    job: JobShape,
    cols: dict[str, list],
    keys: list[PairKey],
    gpu_col: list[str],
    warm_col: list[bool],
    per: list[Pair],
) -> None:
    """The offer columns the phases add (bot/planner/phases.py): the runner's imports on each offer's start,
    one checkpoint save's hours there, and the training loop's hours of its (GPU, count)."""
    if job.import_hours is not None:
        cols["boot"] = [
            b + job.import_hours(g, w) for b, g, w in zip(cols["boot"], gpu_col, warm_col, strict=True)
        ]
    if job.save_hours is not None:
        save_hours = job.save_hours
        cols["ckpt"] = [save_hours(g) for g in gpu_col]
    if job.loop_hours is not None:
        loops: dict[PairKey, float] = {}
        for key, pair in zip(keys, per, strict=True):
            if key not in loops:
                loops[key] = job.loop_hours(*key) if pair[2] is not None else 0.0
        cols["loop"] = [loops[k] for k in keys]


def _pair_figures(offers: Sequence[Offer], keys: list[PairKey], job: JobShape) -> dict[PairKey, Pair]:
    """Memory need, card memory and compute hours once per (GPU type, count): they depend on nothing else."""
    pairs: dict[PairKey, Pair] = {}
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
    return pairs


@dataclass(frozen=True)
class _Costs:
    """offer_costs' results for every offer: ``parts`` indexed by offer, total and wall as float lists."""

    parts: dict[str, Any]
    total: list[float]
    wall: list[float]


def _costs(job: JobShape, cols: dict[str, list], work: list[float]) -> _Costs:
    """The cost formulas over all offers: on numpy arrays from VECTOR_MIN offers on, else on floats."""
    n = len(work)
    cols = {**cols, "loop": cols.get("loop") or work}
    if n >= VECTOR_MIN:
        import numpy as np

        arr = {k: np.asarray(v, dtype=bool if k == "spot" else float) for k, v in cols.items()}
        res = offer_costs(np, job, np.asarray(work), **arr)
        res = {k: np.broadcast_to(v, (n,)) for k, v in res.items()}  # indexed only for returned offers
        return _Costs(res, res["total"].tolist(), res["wall"].tolist())
    rows = [offer_costs(ScalarMath, job, work[i], **{k: v[i] for k, v in cols.items()}) for i in range(n)]
    res = {k: [r[k] for r in rows] for k in rows[0]}
    return _Costs(res, res["total"], res["wall"])


def _pair_category(pair: Pair, key: PairKey, job: JobShape, *, gpus: int, gpu: str | None) -> int:
    """What rules out every offer of one (GPU type, count), or FITS (cheap: once per pair)."""
    need, cap, hours = pair
    g, c = key
    if hours is None:
        return UNKNOWN_GPU
    if gpu and g != gpu:
        return OTHER_GPU
    if c != gpus:
        return GPU_COUNT
    if need * job.memory_upper * (1.0 + SAFETY_MARGIN) > cap:
        return MEMORY
    return FITS


def _offer_categories(
    category: list[int],
    spot: list[bool],
    disk: list[float | None],
    total: list[float],
    job: JobShape,
    *,
    interruptible: bool | None,
    max_cost: float | None,
) -> list[int]:
    """The pairs' categories refined per offer: capacity class, then the host's disk, then the budget."""
    for i, cat in enumerate(category):
        if cat == FITS:
            if interruptible is not None and spot[i] != interruptible:
                category[i] = CLASS
            elif disk[i] is not None and disk[i] < job.disk_gb:
                category[i] = DISK
            elif max_cost is not None and total[i] > max_cost:
                category[i] = BUDGET
    return category


def _labels(fit_idx: list[int], costs: _Costs, spot: list[bool], rel: list[float]) -> dict[int, list[str]]:
    """Offer index -> the labels (LABEL_KEYS) it wins among the fitting offers."""
    labels: dict[int, list[str]] = {}
    if not fit_idx:
        return labels
    for name, sort_key in LABEL_KEYS.items():
        best = min(fit_idx, key=lambda i: sort_key(costs.total[i], costs.wall[i], spot[i], rel[i]))
        labels.setdefault(best, []).append(name)
    return labels


def _rejections_shown(
    offers: Sequence[Offer], category: list[int], per: list[Pair], keep_rejected: int
) -> list[int]:
    """Up to ``keep_rejected`` rejected offers, one per (provider, GPU, count, class), in REJECTION_ORDER;
    memory rejections nearest miss first."""
    buckets: dict[int, list[int]] = {}
    for i, cat in enumerate(category):
        if cat:
            buckets.setdefault(cat, []).append(i)
    if MEMORY in buckets:
        buckets[MEMORY].sort(key=lambda i: per[i][0] / per[i][1])
    rejected: list[int] = []
    seen: set[tuple] = set()
    for cat in sorted(buckets, key=REJECTION_ORDER.index):
        for i in buckets[cat]:
            o = offers[i]
            key = (o.provider, o.gpu, o.gpu_count, o.interruptible)
            if key not in seen:
                seen.add(key)
                rejected.append(i)
                if len(rejected) >= keep_rejected:
                    return rejected
    return rejected


@dataclass(frozen=True)
class _Table:
    """Everything the ranking worked out, by offer index: turned into RankedOffers only for those returned."""

    offers: Sequence[Offer]
    job: JobShape
    per: list[Pair]
    category: list[int]
    labels: dict[int, list[str]]
    costs: _Costs
    disk: list[float | None]
    gpus: int
    gpu: str | None
    max_cost: float | None

    def ranked(self, i: int) -> RankedOffer:
        o, (need, cap, _), res, job = self.offers[i], self.per[i], self.costs.parts, self.job
        total, fits = self.costs.total[i], self.category[i] == FITS
        return RankedOffer(
            provider=o.provider,
            offer_id=o.offer_id,
            gpu=o.gpu,
            gpu_count=o.gpu_count,
            gpu_memory_gb=o.gpu_memory_gb,
            interruptible=o.interruptible,
            price_per_hour=o.price_per_hour,
            hours=round(self.costs.wall[i], 4),
            total_cost=_dollars(total),
            compute_cost=_dollars(float(res["compute"][i])),
            storage_cost=_dollars(float(res["storage"][i])),
            egress_cost=_dollars(float(res["egress"][i])),
            preemption_cost=_dollars(float(res["preempt"][i])),
            total_cost_range=_cost_range(total, float(res["egress"][i]), job.hours_low_high),
            memory_need_gb=[round(need * r, 2) for r in (job.memory_lower, job.memory_upper)],
            memory_capacity_gb=round(cap, 2),
            memory_tight=fits and need * job.memory_upper > TIGHT_SHARE * cap,
            checkpoint_minutes=round(float(res["interval"][i]) * 60, 1),
            checkpoint_save_seconds=round(float(res["ckpt"][i]) * 3600.0, 3),
            phases=self.phases(i),
            max_disk_gb=self.disk[i],
            fits=fits,
            rejected_by=REJECTED_BY.get(self.category[i]),
            reason=self.reason(i),
            labels=self.labels.get(i, []) if fits else [],
            reliability=o.reliability,
            source=o.source,
        )

    def phases(self, i: int) -> dict[str, float] | None:
        """Offer ``i``'s quote by phase, seconds (the runner's phases, its start, download and saves, and on
        interruptible capacity the work expected to be lost): they add up to its hours."""
        job, res = self.job, self.costs.parts
        if job.phases is None or self.per[i][2] is None:
            return None
        o = self.offers[i]
        lost = max(0.0, self.costs.wall[i] - float(res["plain"][i]))
        return offer_phases(
            job.phases(o.gpu, o.gpu_count),
            start_s=float(res["start"][i]) * 3600.0
            - job.download_hours(o.inet_down_mbps or DEFAULT_DOWN_MBPS) * 3600.0,
            download_s=job.download_hours(o.inet_down_mbps or DEFAULT_DOWN_MBPS) * 3600.0,
            saves=float(res["saves"][i]),
            save_s=float(res["ckpt"][i]) * 3600.0,
            lost_s=lost * 3600.0,
        )

    def reason(self, i: int) -> str:
        """Why offer ``i`` fits (and what it is recommended for) or the first rule that rejects it."""
        o, (need, cap, _), job = self.offers[i], self.per[i], self.job
        cat = self.category[i]
        if cat == FITS:
            lab = self.labels.get(i, [])
            text = ("recommended: " + ", ".join(lab)) if lab else "fits"
            text += f" ({need:.1f} of {cap:.1f} GB per GPU"
            text += f", up to {need * job.memory_upper:.1f})" if job.memory_upper > 1.0 else ")"
            if o.interruptible:
                minutes = float(self.costs.parts["interval"][i]) * 60
                text += (
                    f"; checkpoint every {minutes:.0f} min against {o.preemptions_per_hour:.2f} preemptions/h"
                )
            return text
        if cat == MEMORY:
            upper = f", up to {need * job.memory_upper:.1f}" if job.memory_upper > 1.0 else ""
            margin = f"+{SAFETY_MARGIN:.0%} margin"
            return f"needs {need:.1f} GB per GPU{upper} ({margin}); {o.gpu} has {cap:.1f} GB"
        if cat == BUDGET:
            return f"expected {money(self.costs.total[i])} is above the cost limit {money(self.max_cost)}"
        if cat == CLASS:
            kind = "interruptible" if o.interruptible else "on-demand"
            return kind + " (excluded by interruptible=yes|no)"
        if cat == GPU_COUNT:
            return f"{o.gpu_count} GPUs; the request is for {self.gpus} (use gpus={o.gpu_count})"
        if cat == OTHER_GPU:
            return f"not the requested GPU ({self.gpu})"
        if cat == DISK:
            return f"needs {job.disk_gb:.0f} GB of disk; this host offers at most {self.disk[i]:.0f} GB"
        return f"unknown GPU type {o.gpu!r}: no speed figures"
