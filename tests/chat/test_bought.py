"""What the money bought, in the chat layer: the grammar of `compare` and `sweep` (the same for Slack, the
console and the CLI), the result line and the side-by-side answers (a host's text, escaped and cut, within
Block Kit's limits), the comparison table and its chart, the sweep's cards."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.chat import cards
from bot.chat.blockkit import to_message, violations
from bot.chat.escaping import live_tokens, unescape
from bot.chat.grammar import CompareCmd, ParseError, SweepCmd, parse
from bot.engine.api import CompareRun, CompareView, JobView, SweepRunView, SweepView
from runner.contract.spec import RunResults, Sample

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
HOSTILE = "<!channel> <@U0123ABC> *bold* `code` <https://evil.example|click> & " + "x" * 5000


def job(job_id: str = "j1", **over: Any) -> JobView:
    base = dict(
        job_id=job_id,
        owner="U1",
        state="succeeded",
        model="tiny/model",
        method="lora",
        spend=4.1,
        step=24,
        max_steps=24,
        created_at=NOW,
        updated_at=NOW,
    )
    return JobView(**{**base, **over})


def results(**over: Any) -> RunResults:
    base = dict(
        eval_before=2.31,
        eval_after=1.42,
        last_eval=1.60,
        evaluations=5,
        keep="best",
        result_step=16,
        last_step=24,
        why="keep=best: the lowest eval loss of 5 evaluations",
        samples=[Sample(prompt="Count to 3.", base="one one one", tuned="one two three", expected="1 2 3")],
        sample_tokens=48,
    )
    return RunResults(**{**base, **over})


# ---- grammar -----------------------------------------------------------------------------------------------


def test_sweep_takes_comma_separated_values_for_what_it_varies() -> None:
    cmd = parse("/tune sweep llama-3.1-8b lr=1e-4,2e-4,4e-4 r=8,16 dataset=d.jsonl steps=400 max_cost=$20")
    assert isinstance(cmd, SweepCmd)
    assert cmd.grid == {"learning_rate": [1e-4, 2e-4, 4e-4], "lora_r": [8, 16]}
    assert cmd.request.max_cost == 20.0 and cmd.request.max_steps == 400 and cmd.request.dataset == "d.jsonl"
    # targets=q,v is one value (a list of modules), not two configurations
    cmd = parse("sweep llama-3.1-8b lr=1e-4,2e-4 targets=q,v max_cost=5")
    assert isinstance(cmd, SweepCmd) and cmd.request.lora_targets == ["q", "v"] and len(cmd.grid) == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("sweep", "`sweep` needs a MODEL first"),
        ("sweep llama-3.1-8b lr=1e-4 max_cost=5", "a sweep needs an option with several values"),
        ("sweep llama-3.1-8b lr=1e-4,2e-4", "a sweep needs max_cost=$X"),
        ("sweep llama-3.1-8b lr=1e-4,abc max_cost=5", "lr: `abc` is not a number"),
        ("sweep llama-3.1-8b r=8,16 r=4 max_cost=5", "r: is given twice"),
        (
            "sweep llama-3.1-8b lr=1e-4,2e-4,3e-4 r=1,2,3 max_cost=5",
            "9 configurations: a sweep runs at most 8",
        ),
        ("sweep llama-3.1-8b lr=1e-4,2 max_cost=5", "lr:"),  # a learning rate of 2 is refused as in launch
        ("compare j1", "`compare` needs two jobs or more"),
        ("compare j1 'a b'", "is not a job id"),
    ],
)
def test_sweep_and_compare_refuse_with_a_correction(line: str, message: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse(line)
    assert message in caught.value.message, caught.value.message
    assert caught.value.usage.startswith("/tune ")


def test_compare_takes_jobs_or_one_sweep() -> None:
    assert parse("compare a1 b2 a1") == CompareCmd(job_ids=("a1", "b2"))
    assert parse("compare sw-0123456789") == CompareCmd(job_ids=("sw-0123456789",))


# ---- the result and the answers ---------------------------------------------------------------------------


def test_the_result_line_says_what_the_money_bought() -> None:
    line = cards.result_line(job(results=results()))
    assert line == "eval loss 2.31 -> 1.42 (-39%) for $4.10; result: step 16 of 24 (lowest eval loss)"
    assert cards.result_line(job()) is None
    close = cards.eval_change(2.3141, 2.3102)  # two decimals would read the same: four
    assert close == "2.3141 -> 2.3102 (-0%)"
    fields = dict(cards.job_fields(job(results=results())))
    assert fields["Eval loss"].startswith("2.31 -> 1.42 (-39%)") and fields["Result"].startswith("step 16")


def test_a_hosts_answers_are_escaped_and_cut_and_fit_block_kit() -> None:
    hostile = results(
        samples=[Sample(prompt=HOSTILE[:2000], base=HOSTILE[:2000], tuned=HOSTILE[:2000], expected=None)] * 8
    )
    reply = cards.samples_reply(job(results=hostile))
    assert reply is not None
    message = to_message(reply)
    assert violations(message) == []
    dumped = json.dumps(message)
    assert not live_tokens(dumped.replace("\\u003c", "<"))  # no mention, broadcast or link comes alive
    table = next(b for b in message["blocks"] if b["type"] == "table")
    assert len(table["rows"]) == 9 and len(table["rows"][0]) == 3  # header + 8 prompts; prompt, base, tuned
    cell = cards.untrusted(HOSTILE)
    assert (
        len(unescape(cell)) <= cards.SAMPLE_CELL and cell.startswith("&lt;!channel&gt;") and "\n" not in cell
    )


def test_the_status_card_shows_the_answers_side_by_side() -> None:
    reply = cards.job_card(job(results=results()), with_samples=True)
    message = to_message(reply)
    assert violations(message) == []
    table = next(b for b in message["blocks"] if b["type"] == "table")
    header = [
        c.get("elements", [{}])[0].get("elements", [{}])[0].get("text") or c.get("text")
        for c in table["rows"][0]
    ]
    assert header == ["prompt", "held-out answer", "base model", "tuned"]


# ---- comparison -------------------------------------------------------------------------------------------


def compare_view() -> CompareView:
    runs = []
    for i, (lr, after, spend) in enumerate(
        [("0.0001", 1.9, 1.2), ("0.0002", 1.42, 1.3), ("0.0004", 1.7, 0.9)]
    ):
        r = results(eval_after=after, result_step=16 + i)
        runs.append(
            CompareRun(
                job=job(f"j{i}", spend=spend, results=r),
                settings={"learning_rate": lr},
                hours=0.5 + i,
                eval=[(0, 2.31), (8, after + 0.3), (16 + i, after), (24, after + 0.1)],
            )
        )
    return CompareView(runs=runs, differing=["learning_rate"], notes=["not the same data (seed differ)"])


def test_compare_shows_what_differs_and_what_it_bought(tmp_path: Path) -> None:
    from bot.chat.charts import compare_chart, compare_figure

    view = compare_view()
    chart = compare_chart(view, tmp_path / "c.png")
    reply = cards.compare_reply(view, chart=chart)
    table = next(p for p in reply.parts if isinstance(p, cards.Table))
    assert table.columns == [
        "job",
        "lr",
        "eval before",
        "eval after",
        "change",
        "result",
        "cost",
        "time",
        "state",
    ]
    assert table.rows[1][:5] == ["j1", "0.0002", "2.3100", "1.4200", "-39%"]
    context = " ".join(i for p in reply.parts if isinstance(p, cards.Context) for i in p.items)
    assert "lowest eval loss: *j1* (1.4200 for $1.30); cheapest: j2 ($0.90)" in context
    assert "not the same data" in context
    assert violations(to_message(reply)) == []
    assert chart.is_file() and chart.stat().st_size > 5000
    fig = compare_figure(view)
    ax = fig.axes[0]
    assert {line.get_gid() for line in ax.lines} >= {"j0", "j1", "j2", "result-j0", "result-j1", "result-j2"}
    costs = {t.get_gid(): t.get_text() for t in ax.texts}
    assert costs["cost-j1"] == "$1.30"  # the cost marked at each result
    assert ax.get_ylabel() == "eval loss (held-out)"


# ---- sweeps ------------------------------------------------------------------------------------------------


def test_the_sweep_card_is_one_line_per_run_within_block_kit() -> None:
    runs = [
        SweepRunView(
            index=i,
            settings={"lr": lr, "r": "8"},
            job=job(f"j{i}", state="running" if i < 2 else "stopped", step=16 if i < 2 else 8),
            status="running" if i < 2 else "lost",
            stage_evals={8: 2.0 + i / 10, **({16: 1.8 + i / 10} if i < 2 else {})},
            cap=2.0,
            note=None if i < 2 else "stopped after stage 1",
        )
        for i, lr in enumerate(["0.0001", "0.0002", "0.0004", "0.0008"])
    ]
    view = SweepView(
        sweep_id="sw-0123456789",
        owner="U1",
        state="running",
        model="tiny/model",
        stage=1,
        survivors=[4, 2, 1],
        max_cost=20.0,
        estimated_cost=6.0,
        spend=7.5,
        reserved=11.0,
        runs=runs,
        created_at=NOW,
        updated_at=NOW,
    )
    reply = cards.sweep_card(view)
    assert violations(to_message(reply)) == []
    table = next(p for p in reply.parts if isinstance(p, cards.Table))
    assert table.columns == ["run", "lr", "r", "job", "step", "eval @8", "eval @16", "spend", "status"]
    assert len(table.rows) == 4 and table.rows[2][-1] == "lost (stopped after stage 1)"
    header = next(p for p in reply.parts if isinstance(p, cards.Header))
    assert header.text == "Sweep sw-0123456789: running, stage 2 of 3"


def test_a_run_stopped_before_its_result_shows_its_last_eval_at_its_step() -> None:
    view = compare_view()
    stopped = CompareRun(
        job=job("j9", state="stopped", stop_reason="sweep", spend=0.4), eval=[(0, 2.31), (8, 2.0)], hours=0.2
    )
    view = view.model_copy(update={"runs": [*view.runs, stopped]})
    table = next(p for p in cards.compare_reply(view).parts if isinstance(p, cards.Table))
    assert table.rows[-1][2:7] == ["2.3100", "2.0000 @8", "-13%", "-", "$0.40"]
    assert table.rows[-1][-1] == "stopped (sweep)"
    from bot.chat.charts import compare_figure

    ax = compare_figure(view).axes[0]
    stopped_mark = next(line for line in ax.lines if line.get_gid() == "result-j9")
    assert stopped_mark.get_marker() == "X" and list(stopped_mark.get_xdata()) == [8]  # where it stopped
    assert {t.get_gid(): t.get_text() for t in ax.texts}["cost-j9"] == "$0.40"
    assert any("j1 lr=0.0002 · $1.30" in text.get_text() for text in ax.get_legend().get_texts())
