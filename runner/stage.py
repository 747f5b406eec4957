"""A sweep's run pauses at each stage boundary until the sweep decides (runner/contract/stage.py).

At a boundary (``JobSpec.stages.steps``) the run has its eval loss at that step (evaluated now if its cadence
did not), saves a checkpoint and reports both (one ``checkpoint`` event: the sweep ranks on that eval, and a
resume goes on from that checkpoint), then waits without training: each ``poll_seconds`` it reads the sweep's
decision from its checkpoint folder. A decision signed with its key for a step at or past the boundary lets it
go on (with the raised cap it carries); SIGTERM (the sweep stopped it, or a preemption) ends the wait with
the checkpoint just saved; its spend cap still holds while it waits. While waiting it reports every
``report.every_seconds``, so the bot sees it alive. The wait is billed: the sweep decides as soon as every run
of the stage has its eval, and its caps leave room for the wait.
"""

from __future__ import annotations

import time
from typing import Any

from runner.contract.spec import EventKind, JobSpec
from runner.contract.stage import Released, decision_uri, released

# The phase the wait counts in (runner/contract/phases.py): not a training phase, so a sweep's waits never
# read as a slower step to the calibration; the wait follows the boundary's checkpoint.
WAIT_PHASE = "checkpoints"


class StageGate:
    """Where this run pauses, and whether the sweep has let it go on."""

    def __init__(self, spec: JobSpec, key: bytes | None) -> None:
        self.spec = spec
        self.key = key
        self.steps = frozenset(spec.stages.steps) if spec.stages else frozenset()
        self.uri = decision_uri(spec.checkpoint.uri)

    def due(self, step: int, max_steps: int) -> bool:
        """``step`` is a boundary before the end that the sweep has not let this run past yet."""
        if step not in self.steps or step >= max_steps:
            return False
        got = self.decision()
        return got is None or got.through < step

    def decision(self) -> Released | None:
        """The sweep's decision for this run, when one signed with its key is there (None otherwise)."""
        import fsspec

        try:
            with fsspec.open(self.uri, "rb") as fh:
                raw = fh.read(64 * 1024)
        except (OSError, ValueError):
            return None
        return released(raw, self.key, self.spec.job_id, self.spec.run_id)

    def wait(self, trainer: Any) -> str | None:
        """Evaluate, save and report at this boundary, then wait for the sweep: None when it lets the run go
        on, "preempted" (SIGTERM: stopped by the sweep, or preempted) or "budget" (the cap reached while
        waiting) when the run must end."""
        state, group, spec, clock = trainer.state, trainer.group, trainer.spec, trainer.clock
        step = state.step
        if trainer.data.eval and not any(s == step for s, _ in trainer.evals):
            with clock.phase("evals"):
                trainer._eval_now(step)  # the sweep ranks on the eval at the boundary
        trainer._read_losses()  # every step's loss up to here rides with the report
        with clock.phase("checkpoints"):
            uri = trainer.save()
        trainer.emit(
            EventKind.checkpoint,
            checkpoint_uri=uri,
            manifest_sha256=trainer.manifest_sha256,
            message=f"stage boundary at step {step}: waiting for the sweep's decision",
        )
        if group.main:
            print(f"stage boundary at step {step}: waiting for the sweep's decision", flush=True)
        poll = spec.stages.poll_seconds if spec.stages else 2.0
        last_report, next_look = time.monotonic(), 0.0
        with clock.phase(WAIT_PHASE):
            while True:
                got = None
                if time.monotonic() >= next_look:
                    got, next_look = self.decision(), time.monotonic() + poll
                go = got is not None and got.through >= step
                preempted, capped, go_on = (
                    bool(v)
                    for v in group.all_max(
                        [float(trainer.preemption.requested), float(trainer._at_cap()), float(go)]
                    )
                )
                if preempted:
                    trainer.emit(
                        EventKind.preempted,
                        checkpoint_uri=uri,
                        manifest_sha256=trainer.manifest_sha256,
                        message=f"{trainer.preemption.why} at the boundary (step {step}): saved and exiting",
                    )
                    return "preempted"
                if go_on:
                    got = got or self.decision()  # another process read it first
                    if got is not None and got.max_cost is not None:  # the sweep raised the run's cap
                        spec.cost = spec.cost.model_copy(update={"max_cost": got.max_cost})
                    if group.main:
                        print(f"stage boundary at step {step}: the sweep keeps this run", flush=True)
                    return None
                if capped:
                    trainer.cap_note = trainer._cap_message(saved=True)
                    trainer.emit(
                        EventKind.budget,
                        checkpoint_uri=uri,
                        manifest_sha256=trainer.manifest_sha256,
                        message=trainer.cap_note,
                    )
                    return "budget"
                if group.main and time.monotonic() - last_report >= spec.report.every_seconds:
                    print(f"waiting at the stage boundary (step {step})", flush=True)
                    trainer.emit(EventKind.progress, message=f"waiting at the stage boundary (step {step})")
                    last_report = time.monotonic()
                time.sleep(min(0.1, poll))
