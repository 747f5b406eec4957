"""Optional Weights & Biases logging with a fixed run id, so a resumed run continues the same W&B run.

Skipped silently when the spec disables it or wandb cannot be imported; `mode: online` (what the bot asks
for when it has a WANDB_API_KEY) logs to W&B under ``wandb.project`` / ``wandb.entity`` and gives the run's
URL for the job's thread; `mode: offline` writes to ./wandb (or WANDB_DIR) without network. The API key
comes from the WANDB_API_KEY environment variable, never from the spec.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from runner.spec import JobSpec


class WandbLog:
    def __init__(self) -> None:
        self.run: Any = None
        self.run_id: str | None = None
        self.url: str | None = None  # the run's page (online runs)

    def start(self, spec: JobSpec, run_id: str | None, config: dict[str, Any]) -> str | None:
        """Start or resume the W&B run; return its id (saved in checkpoints) or None when not logging."""
        if spec.wandb.mode == "disabled":
            return run_id
        try:
            import wandb
        except Exception:  # wandb is optional; a broken install must not stop training
            return run_id
        self.run_id = run_id or spec.wandb.run_id or f"{spec.job_id[:40]}-{uuid.uuid4().hex[:8]}"
        try:
            self.run = wandb.init(project=spec.wandb.project or "tunebot", entity=spec.wandb.entity,
                                  id=self.run_id, resume="allow", mode=spec.wandb.mode, name=spec.job_id,
                                  config=config, dir=os.environ.get("WANDB_DIR") or None)
        except Exception as exc:  # logging is best effort
            print(f"note: W&B disabled ({type(exc).__name__}: {exc})", flush=True)
            self.run = None
        if self.run is not None and spec.wandb.mode == "online":
            url = getattr(self.run, "url", None)
            self.url = str(url) if url else None
            if self.url:
                print(f"W&B run: {self.url}", flush=True)
        return self.run_id

    def log(self, values: dict[str, Any], step: int) -> None:
        if self.run is not None:
            try:
                self.run.log(values, step=step)
            except Exception:
                pass

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            try:
                self.run.finish(exit_code=exit_code)
            except Exception:
                pass
            self.run = None
