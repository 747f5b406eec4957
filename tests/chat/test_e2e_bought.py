"""What the money bought, end to end: real tiny training on this CPU through the chat commands, the real
engine and the local provider (the harness of tests/chat/test_e2e_result.py).

- A job with an eval split and samples: the base model measured before training and the result after, on
  the same held-out data; the thread's finish line says "eval loss A -> B (-N%) for $X" with the ledger's
  spend; both models' answers are shown side by side (escaped, cut); the model card has them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.worlds import ConsoleWorld, console_world
from fakes.worlds import console_text as text

from bot.chat.replies import Image, Table
from bot.engine.events import EngineEventKind
from bot.engine.record.jobstate import FINAL

CADENCE = {"checkpoint": {"every_minutes": 0.02, "keep": 2}, "report": {"every_seconds": 0.3}}
SHARED = "seq=256 batch=4 accum=1 warmup=5% scheduler=cosine seed=0 plateau=no checkpointing=no"
TINY = f"{SHARED} r=8 alpha=16"
# The sweep's steps are 8x bigger: a stage is decided once every live run has its eval loss at the stage's
# step, a tick or two after the slowest; the runs must not reach the full length before (one OpenMP thread
# and a prewarmed start make a 2,048-token step of the tiny model take about 0.1 s here).
SWEEP = SHARED.replace("batch=4 accum=1", "batch=8 accum=4")


@pytest.fixture
def world(tmp_path: Path, tiny_model: Path) -> Iterator[ConsoleWorld]:
    """fakes.worlds.ConsoleWorld on the suite's one tiny model (tests/chat/conftest.py)."""
    with console_world(tmp_path, tiny_model, CADENCE) as w:
        yield w


@pytest.fixture
def default_world(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ConsoleWorld]:
    """The world with W&B as a user without a W&B key has it: off, the default path (the suite's other
    runners log to W&B offline, tests/conftest.py)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with console_world(tmp_path, tiny_model, CADENCE) as w:
        yield w


@pytest.mark.slow
def test_before_and_after_on_the_same_data_with_answers_side_by_side(world: ConsoleWorld) -> None:
    from bot.chat.notifier import milestone_text

    job_id = world.launch(
        f"launch {world.model} dataset={world.data} {TINY} lr=1e-2 steps=20 eval=10% samples=2 max_cost=$20"
    )
    world.until(lambda: world.engine.get_job(job_id).state in FINAL, "the finish")
    job = world.engine.get_job(job_id)
    assert job.state == "succeeded", job.message
    r = job.results
    assert r is not None and r.eval_before is not None and r.eval_after is not None
    assert r.eval_after < r.eval_before  # the tuned model is better on the held-out split
    series = world.engine.series(job_id)
    assert series.eval[0] == (0, pytest.approx(r.eval_before))  # measured at step 0, on the chart too
    # The finish line: before -> after with the change, for the job's spend (the ledger's).
    finished = next(e for e in world.events if e.kind is EngineEventKind.finished and e.job_id == job_id)
    line = milestone_text(finished, job)
    change = f"{(r.eval_after / r.eval_before - 1) * 100:+.0f}%"
    assert f"Eval loss {r.eval_before:.2f} -> {r.eval_after:.2f} ({change}) for ${job.spend:,.2f}" in line
    # Both models answered the same two held-out prompts: shown side by side by `status JOB`.
    assert len(r.samples) == 2 and all(s.prompt for s in r.samples)
    card = world.say(f"status {job_id}")
    tables = [p for p in card.parts if isinstance(p, Table) and (p.title or "").startswith("Side by side")]
    assert tables and tables[0].columns == ["prompt", "held-out answer", "base model", "tuned"]
    assert len(tables[0].rows) == 2 and "Eval loss" in text(card)
    readme = Path(job.output_uri or "", "README.md").read_text()
    assert "(base model) ->" in readme and "## Side by side" in readme


@pytest.mark.slow
@pytest.mark.alone  # its spend is held against its quote: run with nothing else of the suite on the cores
def test_a_sweep_of_four_stops_the_losing_half_within_max_cost_and_reports_the_winner(
    default_world: ConsoleWorld,
) -> None:
    """lr x r = 4 configurations, successive halving 4 -> 2 -> 1: at each stage the worse half is stopped
    (and its host torn down) at the stage's last step, not a step past it (issue 36, item 4: on 9a0c9c1 the
    runs stopped at step 8 trained on to steps 19 and 10, the one stopped at 16 to 28), so each run spends
    what its stages were quoted; the caps reserved never add up to more than max_cost, the whole sweep spends
    less than max_cost, and it ends with the runs compared and the winner's adapter."""
    world = default_world  # W&B off, as a user without a W&B key has it
    from bot.chat.replies import Table as TableT

    max_cost = 40.0  # the caps scale with it: room for runner start-ups on a loaded 2-core machine
    reply = world.say(
        f"sweep {world.model} dataset={world.data} {SWEEP} steps=32 eval=10% samples=1 "
        f"lr=1e-3,2e-2 r=4,8 max_cost=${max_cost:g}"
    )
    said = text(reply)
    assert "Sweep of 4 configurations" in said and "4 -> 2 -> 1 runs (to step 8, 16, 32)" in said, said
    launch = [b for b in reply.buttons if b.action == "launch_sweep"]
    assert launch, said
    launched = world.chat.launch(launch[0].value, "sweep", world.alice)
    assert launched.kind == "success", text(launched)
    sweep_id = world.engine.list_jobs(user="alice")[0].sweep_id
    assert sweep_id

    reserved: list[float] = []

    def ended() -> bool:
        view = world.engine.get_sweep(sweep_id)
        reserved.append(
            sum(r.cap if r.status == "running" else (r.job.spend if r.job else 0) for r in view.runs)
        )
        return view.state not in ("running", "pending_approval")

    world.until(ended, "the sweep's end", timeout=900)
    view = world.engine.get_sweep(sweep_id)
    assert view.state == "done", (view.message, [(r.status, r.note) for r in view.runs])
    assert max(reserved) <= max_cost * 0.9 + 1e-6  # the caps as reserved: never more than max_cost
    statuses = sorted(r.status for r in view.runs)
    assert statuses == ["lost", "lost", "lost", "won"], statuses
    stage_events = [e for e in world.events if e.kind is EngineEventKind.sweep_stage and "kept" in e.data]
    assert [len(e.data["stopped"]) for e in stage_events] == [2, 1]  # the losing half, then the next
    first_stopped = stage_events[0].data["stopped"]
    for stage, event in enumerate(stage_events):  # each stopped at its stage's last step, not one past it
        for job_id in event.data["stopped"]:
            job = world.engine.get_job(job_id)
            assert job.state == "stopped" and job.stop_reason == "sweep", job
            assert job.step == [8, 16][stage] and job.checkpoint_step == job.step, (stage, job)
    assert not [i for i in world.local.list_instances() if i.job_id in first_stopped]
    # The sweep spent what it quoted for the stages it ran (each run's start-up beside the prewarmed process
    # its second launch starts, its stages' steps and the pauses at their boundaries: RunCost), within the
    # room its caps leave for estimate error and the waits for the slower runs (SLACK). On 0368a4c, x1.31
    # alone and x2.1 beside the other test worker's runners; now x1.01 alone (it runs alone: scripts/test.sh).
    # On ebab0c5 its verification was priced as a run of one step beside the four and spent x0.09-x0.21 of
    # that: the whole sweep at x0.65 in a CI run (96954b6 prices it as what it does).
    from bot.engine.control.sweeps import SLACK, RunCost
    from store.models import Sweep

    with world.engine.session() as s:
        plan = s.get(Sweep, sweep_id).plan
    costs = [RunCost(**c) for c in plan["costs"]]
    (checker,) = [j for j in world.engine.list_jobs() if j.sweep_id == sweep_id and not j.step]
    quoted = [costs[r.index].at_step(r.job.step) for r in view.runs]
    spent = [r.job.spend for r in view.runs]
    quoted.append(plan["verify_cost"])  # the winner measured again on another host (verify.py)
    spent.append(checker.spend)
    # The verification was quoted as what it does (verify.phases_of): no step, save or answer.
    verifies = set(world.engine.get_job(checker.job_id).quoted_phases or {})
    assert verifies == {"start", "load", "data", "wandb", "base_eval", "evals"}, verifies
    assert 1 / (1 + SLACK) <= sum(spent) / sum(quoted) <= 1 + SLACK, (spent, quoted)
    # It never spent more than max_cost, and says so with the winner and its adapter.
    total = sum(spent)
    assert 0 < total <= max_cost and view.spend == pytest.approx(total, abs=1e-6)
    winner = world.engine.get_job(view.winner or "")
    assert winner.state == "succeeded" and winner.step == 32 and winner.output_uri
    assert Path(winner.output_uri, "adapter_model.safetensors").is_file()
    done = next(e for e in world.events if e.kind is EngineEventKind.sweep_done)
    assert f"Winner: job {winner.job_id}" in done.message and winner.output_uri in done.message
    assert f"measured again on another host (job {checker.job_id})" in done.message  # its figure, checked
    # The winner had the lowest eval loss at every stage it went through.
    for e in stage_events:
        kept = e.data["kept"]
        assert winner.job_id in kept
    # The compare view of the sweep's runs: one row each, the chart with every eval curve.
    compared = world.say(f"compare {sweep_id}")
    table = next(p for p in compared.parts if isinstance(p, TableT))
    assert table.columns[:3] == ["job", "r", "lr"] and len(table.rows) == 4, text(compared)
    assert f"lowest eval loss: {winner.job_id}" in text(compared), text(compared)
    assert any(isinstance(p, Image) and p.path and p.path.is_file() for p in compared.parts)


@pytest.mark.slow
def test_a_host_reporting_0_01_at_every_stage_does_not_pick_the_sweeps_model(world: ConsoleWorld) -> None:
    """Issue 38, item 2: one host decided a sweep. The runs at lr=0.001 run on a hostile host
    (tests/fakes/hostile_runner.py: the real runner reporting an eval loss of 0.01 after the base model's,
    every report signed with its run's key). Their claims win both stages - the stages are ranked on what
    hosts report - but before a winner is named its output is measured again by another runner process on
    the held-out split; the claim does not hold, the run is excluded with both figures in the sweep's thread,
    and the sweep names no winner and adopts no adapter (on 9a0c9c1: "Winner: ... -> 0.0100 (-100%)")."""
    import sys

    world.local.runner_command = [
        sys.executable,
        str(Path(__file__).parents[1] / "fakes" / "hostile_runner.py"),
    ]
    world.local.extra_env["TUNEBOT_TEST_HOSTILE_LR"] = "0.001"
    reply = world.say(
        f"sweep {world.model} dataset={world.data} {SWEEP} steps=32 eval=10% samples=1 "
        "lr=1e-3,2e-2 r=4,8 max_cost=$40"
    )
    said = text(reply)
    assert "measured again on the held-out split on another host" in said, said
    launch = [b for b in reply.buttons if b.action == "launch_sweep"]
    assert world.chat.launch(launch[0].value, "sweep", world.alice).kind == "success"
    sweep_id = world.engine.list_jobs(user="alice")[0].sweep_id or ""
    world.until(lambda: world.engine.get_sweep(sweep_id).state not in ("running",), "the sweep's end", 900)
    view = world.engine.get_sweep(sweep_id)
    liars = {r.job.job_id for r in view.runs if r.job and r.settings["lr"] == "0.001"}
    stage_events = [e for e in world.events if e.kind is EngineEventKind.sweep_stage and "kept" in e.data]
    assert set(stage_events[0].data["kept"]) == liars  # the claims did move the stages: the attack is real
    assert view.state == "failed" and view.winner is None, view.message
    (excluded,) = [r for r in view.runs if r.status == "excluded"]
    assert excluded.job and excluded.job.job_id in liars
    checker = next(j for j in world.engine.list_jobs() if j.sweep_id == sweep_id and j.results and not j.step)
    measured = checker.results.eval_after
    assert measured is not None and measured > 1.0  # what the lying run's output really scores
    said = f"its host reported eval loss 0.0100; measured again on another host (job {checker.job_id}): "
    assert excluded.note == f"{said}{measured:.4f}", excluded.note
    done = next(e for e in world.events if e.kind is EngineEventKind.sweep_done)
    assert said in done.message and "no winner" in done.message and "Winner:" not in done.message
    assert "-100%" not in done.message and "Adapter:" not in done.message
    assert view.spend <= 40.0
