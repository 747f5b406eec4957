"""The charts people read: what a training chart draws (series, axes, marks, title) and the spend chart."""

from __future__ import annotations

from pathlib import Path

from bot.chat.charts import spend_chart, spend_figure, training_chart, training_figure
from bot.engine.api import JobSeries


def series(**kw) -> JobSeries:  # noqa: ANN003
    base = dict(
        job_id="j7",
        model="Qwen/Qwen2.5-7B",
        method="qlora",
        provider="vast",
        gpu="rtx-4090",
        gpu_count=1,
        interruptible=True,
        step=120,
        max_steps=120,
        train=[(s, 3.0 - s / 100) for s in range(1, 121)],
        eval=[(s, 3.1 - s / 100) for s in (20, 40, 60, 80, 100, 120)],
        lr=[(s, 2e-4 * min(1.0, s / 10)) for s in range(1, 121)],
        preemptions=[50],
        resumes=[48],
    )
    return JobSeries(**{**base, **kw})


def lines(fig, gid: str) -> list:  # noqa: ANN001
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == gid]


def test_training_chart_draws_every_step_eval_lr_and_marks() -> None:
    fig = training_figure(series())
    (train,) = lines(fig, "train")
    assert list(train.get_xdata()) == list(range(1, 121))  # every reported step, from step 1
    (evals,) = lines(fig, "eval")
    assert list(evals.get_xdata()) == [20, 40, 60, 80, 100, 120]
    (lr,) = lines(fig, "lr")
    loss_ax, lr_ax = fig.axes
    assert lr in lr_ax.get_lines() and lr_ax.get_ylabel() == "learning rate"  # its own axis
    assert loss_ax.get_ylabel() == "loss" and loss_ax.get_xlabel() == "step"
    assert [line.get_xdata()[0] for line in lines(fig, "preempted")] == [50]
    assert [line.get_xdata()[0] for line in lines(fig, "resumed")] == [48]
    assert loss_ax.get_xlim()[0] <= 1
    assert fig._suptitle.get_text() == "Qwen/Qwen2.5-7B · qlora · rtx-4090 x1"
    assert "job j7 on vast (spot) · step 120/120 · 1 preemption(s)" in loss_ax.get_title()
    legend = [t.get_text() for t in loss_ax.get_legend().get_texts()]
    assert legend == ["train loss", "eval loss", "learning rate", "preempted", "resumed"]


def test_a_chart_without_evals_lr_or_marks_has_only_the_train_line(tmp_path: Path) -> None:
    fig = training_figure(series(eval=[], lr=[], preemptions=[], resumes=[], provider=None, gpu=None))
    assert len(fig.axes) == 1 and len(lines(fig, "train")) == 1
    assert not lines(fig, "preempted") and fig._suptitle.get_text().endswith("not placed")
    path = training_chart(series(), tmp_path / "j7.png")
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 20_000


def test_spend_chart_stacks_people_by_name_with_a_running_total(tmp_path: Path) -> None:
    days = ["12-01", "12-02", "12-03"]
    fig = spend_figure(
        days,
        {"UALICE0001": [1.0, 2.0, 0.5], "UBOB00002": [0.5, 0.0, 4.0]},
        names={"UALICE0001": "alice", "UBOB00002": "Bob Stone"}.get,
        budget_per_day=2.0,
    )
    bars, total_ax = fig.axes
    legend = [t.get_text() for t in bars.get_legend().get_texts()]
    assert legend[:2] == ["Bob Stone", "alice"]  # biggest spender first, by name
    (total,) = lines(fig, "total")
    assert list(total.get_ydata()) == [1.5, 3.5, 8.0]
    assert lines(fig, "budget")
    path = spend_chart(tmp_path / "spend.png", days, {"UALICE0001": [1.0, 2.0, 0.5]})
    assert path.read_bytes().startswith(b"\x89PNG")
