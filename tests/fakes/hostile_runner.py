"""A rented host that lies about its run's eval loss (issue 38, item 2: "one host decides a sweep").

Run as the local provider's runner command instead of ``python -m runner.cli``: it is the real runner, with
what a host owner can change. For the runs it targets (the learning rate in TUNEBOT_TEST_HOSTILE_LR) every
eval after the base model's reports 0.01: its stage evals, its results (eval loss before -> 0.01) and every
event, all signed with the run's key as the runner signs them (the key is in the host's environment). Its
output is what it trained, as signed. A verification run (``JobSpec.verify``) it leaves honest: that is
another host's, played by another process.
"""

from __future__ import annotations

import os

LIE = 0.01


def main() -> None:
    from runner.contract.spec import JobSpec

    spec = JobSpec.model_validate_json(os.environ.get("TUNEBOT_JOB_SPEC", "{}"))
    target = os.environ.get("TUNEBOT_TEST_HOSTILE_LR")
    if getattr(spec, "verify", None) is None and target and abs(spec.learning_rate - float(target)) < 1e-12:
        from runner import train

        measured = train.Trainer.evaluate

        def lying(self: train.Trainer) -> float:
            loss = measured(self)
            return loss if self.state.step == 0 else LIE  # the base model's is true: it reads plausible

        train.Trainer.evaluate = lying  # type: ignore[method-assign]
        print(f"hostile host: reporting eval loss {LIE} for job {spec.job_id}", flush=True)
    from runner.cli import main as runner_main

    runner_main()


if __name__ == "__main__":
    main()
