"""The PNG charts tunebot posts: a job's training chart (its thread) and the week's spend (the weekly report).

matplotlib's Agg canvas on a Figure of our own (no pyplot state: thread-safe), imported only when a chart
is drawn. Each chart is built by a ``*_figure`` function (tests read its lines, marks and labels) and
saved by the function named after it. People are drawn by name: a PNG cannot render a mention.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from bot.engine.api import CompareView, JobSeries

TRAIN, EVAL, LR = "#1f77b4", "#ff7f0e", "#7f7f7f"
PREEMPTED, RESUMED = "#d62728", "#2ca02c"
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def charts_folder(data_dir: str | Path) -> Path:
    """Where the charts a person is pointed at are kept (`compare`, a sweep's end): ``<data dir>/charts``,
    with the rest of tunebot's files (TUNEBOT_DATA_DIR), never a stray folder in /tmp. Private to its user."""
    folder = Path(data_dir) / "charts"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def model_name(model: str) -> str:
    """A hub id as it is; a local path or URI by its last two parts ('tiny/model', not the whole path)."""
    if model.startswith(("/", "~", ".")) or "://" in model:
        parts = [p for p in model.replace("://", "/").split("/") if p]
        return "/".join(parts[-2:]) or model
    return model


def chart_title(series: JobSeries) -> str:
    """'Qwen2.5-7B · qlora · rtx-4090 x1': what was trained, how, and on what."""
    gpu = f"{series.gpu} x{series.gpu_count or 1}" if series.gpu else "not placed"
    return f"{model_name(series.model)} · {series.method} · {gpu}"


def _subtitle(series: JobSeries) -> str:
    where = ""
    if series.provider:
        where = f" on {series.provider} ({'spot' if series.interruptible else 'on-demand'})"
    steps = f"step {series.step}" + (f"/{series.max_steps}" if series.max_steps else "")
    marks = f" · {len(series.preemptions)} preemption(s)" if series.preemptions else ""
    return f"job {series.job_id}{where} · {steps}{marks}"


def training_figure(series: JobSeries) -> Figure:
    """Train loss (every step) and eval loss against step, the learning rate on a second axis, a dashed
    red line at each preemption and a dotted green one where the run resumed."""
    fig = _figure(10, 5.2)
    ax = fig.add_subplot(1, 1, 1)
    if series.train:
        steps, losses = zip(*series.train, strict=True)
        ax.plot(
            steps,
            losses,
            color=TRAIN,
            linewidth=1.3,
            label="train loss",
            gid="train",
            marker="." if len(steps) < 80 else None,
            markersize=3,
        )
    if series.eval:
        steps, losses = zip(*series.eval, strict=True)
        ax.plot(
            steps, losses, color=EVAL, linewidth=1.4, marker="o", markersize=4, label="eval loss", gid="eval"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    first = min([s for s, _ in series.train + series.eval], default=1)
    ax.set_xlim(left=min(1, first), right=max(series.step, *(s for s, _ in series.train or [(1, 0)]), 2))
    handles, labels = ax.get_legend_handles_labels()
    if series.lr:
        lr_ax = ax.twinx()
        steps, rates = zip(*series.lr, strict=True)
        (line,) = lr_ax.plot(
            steps, rates, color=LR, linewidth=1.0, linestyle="--", label="learning rate", gid="lr"
        )
        lr_ax.set_ylabel("learning rate", color=LR)
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        lr_ax.tick_params(axis="y", colors=LR)
        handles.append(line)
        labels.append("learning rate")
    for row, (kind, steps, color, style) in enumerate(
        (("preempted", series.preemptions, PREEMPTED, "--"), ("resumed", series.resumes, RESUMED, ":"))
    ):
        for i, step in enumerate(steps):
            line = ax.axvline(step, color=color, linestyle=style, linewidth=1.5, gid=kind)
            ax.annotate(  # the two kinds on their own rows: a resume often sits on its preemption's step
                f"{kind} @{step}",
                xy=(step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -12 - 11 * row),
                textcoords="offset points",
                color=color,
                fontsize=8,
            )
            if i == 0:
                handles.append(line)
                labels.append(kind)
    if handles:
        ax.legend(handles, labels, loc="upper right", fontsize=8, framealpha=0.85)
    fig.suptitle(chart_title(series)[:120], fontsize=12, fontweight="bold")
    ax.set_title(_subtitle(series)[:140], fontsize=9, color="#555555")
    fig.tight_layout()
    return fig


def training_chart(series: JobSeries, path: Path) -> Path:
    """The job's training chart as a PNG at ``path``."""
    return _save(training_figure(series), path)


def spend_figure(
    days: list[str],
    by_person: dict[str, list[float]],
    *,
    names: Callable[[str], str] | None = None,
    budget_per_day: float | None = None,
    title: str = "Spend per day",
) -> Figure:
    """Stacked bars of spend per day by person (by name), the running total on a second axis."""
    fig = _figure(10, 5)
    ax = fig.add_subplot(1, 1, 1)
    bottom = [0.0] * len(days)
    name = names or (lambda u: u)
    ranked = sorted(by_person.items(), key=lambda kv: -sum(kv[1]))
    for i, (person, amounts) in enumerate(ranked):
        ax.bar(
            days, amounts, bottom=bottom, color=PALETTE[i % len(PALETTE)], label=name(person)[:40], gid=person
        )
        bottom = [b + a for b, a in zip(bottom, amounts, strict=True)]
    ax.set_ylabel("$ per day")
    ax.grid(True, axis="y", alpha=0.3)
    total_ax = ax.twinx()
    running: list[float] = []
    for amount in bottom:
        running.append((running[-1] if running else 0.0) + amount)
    total_ax.plot(
        days, running, color="#333333", marker="o", linewidth=1.5, label="total so far", gid="total"
    )
    total_ax.set_ylabel("$ total")
    if budget_per_day:
        total_ax.plot(
            days,
            [budget_per_day * (i + 1) for i in range(len(days))],
            color=PREEMPTED,
            linestyle="--",
            linewidth=1,
            label="budget pace",
            gid="budget",
        )
    total_ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    more_h, more_l = total_ax.get_legend_handles_labels()
    ax.legend(handles + more_h, labels + more_l, loc="upper left", fontsize=8, framealpha=0.85)
    fig.suptitle(title[:120], fontsize=12, fontweight="bold")
    fig.tight_layout()
    return fig


def spend_chart(path: Path, days: list[str], by_person: dict[str, list[float]], **kwargs: Any) -> Path:
    return _save(spend_figure(days, by_person, **kwargs), path)


def compare_figure(view: CompareView) -> Figure:
    """Every run's eval loss against step (step 0: the base model) on one chart, each run's cost written at
    its end: a star at the result's step for a run that finished, a cross at the last eval of one stopped
    before it (a sweep's losers)."""
    from bot.money import money
    from bot.planner.options import BY_FIELD

    fig = _figure(10, 5.2)
    ax = fig.add_subplot(1, 1, 1)
    for i, run in enumerate(view.runs):
        color = PALETTE[i % len(PALETTE)]
        job_id, cost = run.job.job_id, money(run.job.spend)
        settings = " ".join(f"{BY_FIELD[k].key if k in BY_FIELD else k}={v}" for k, v in run.settings.items())
        label = f"{job_id} {settings}".strip()[:60] + f" · {cost}"
        if run.eval:
            steps, losses = zip(*run.eval, strict=True)
            ax.plot(
                steps, losses, color=color, marker="o", markersize=3, linewidth=1.4, label=label, gid=job_id
            )
        r = run.job.results
        if r is not None and r.eval_after is not None:
            end, marker = (r.result_step, r.eval_after), "*"
        elif run.eval and run.eval[-1][0] > 0:
            end, marker = run.eval[-1], "X"
        else:
            continue
        ax.plot([end[0]], [end[1]], marker=marker, markersize=12, color=color, gid=f"result-{job_id}")
        ax.annotate(
            cost,
            xy=end,
            xytext=(6, -12),
            textcoords="offset points",
            color=color,
            fontsize=8,
            gid=f"cost-{job_id}",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("eval loss (held-out)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8, framealpha=0.85)
    title = (
        f"Eval loss of {len(view.runs)} runs (star: a result, cross: stopped before it; each with its cost)"
    )
    fig.suptitle(title[:120], fontsize=12)
    fig.tight_layout()
    return fig


def compare_chart(view: CompareView, path: Path) -> Path:
    """The comparison's chart as a PNG at ``path``."""
    return _save(compare_figure(view), path)
