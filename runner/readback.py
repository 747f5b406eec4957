"""Each step's loss stays on the device until something needs it on the host, then all of them come at once.

Reading a loss back (``float(loss)``, ``.cpu()``, ``.item()``) makes the host wait until the device has
finished everything queued before it: once per optimizer step that drains the queue, and a GPU whose host
dispatches the next step only after the last one finished idles between steps (most of all at small
micro-batches, where dispatch is what a step costs). The loop keeps each step's loss as a 0-d device tensor
here and reads the pending ones in one transfer when a report, a plateau decision on the training loss, a
checkpoint or the end needs them: one sync per report instead of one per step. On the CPU the tensors are on
the host already and reading them costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepLoss:
    step: int
    loss: float  # mean per label token of the step
    lr: float
    epoch: float
    tokens_seen: int


class PendingLosses:
    """The steps whose loss has not been read back yet, oldest first."""

    def __init__(self) -> None:
        self._rows: list[tuple[int, torch.Tensor | float, float, float, int]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, step: int, loss: torch.Tensor | float, lr: float, epoch: float, tokens_seen: int) -> None:
        kept = loss.detach() if isinstance(loss, torch.Tensor) else loss
        self._rows.append((step, kept, lr, epoch, tokens_seen))

    def read(self) -> list[StepLoss]:
        """Every pending step with its loss as a float (one device-to-host transfer), and forget them."""
        rows, self._rows = self._rows, []
        if not rows:
            return []
        tensors = [r[1].reshape(()).double() for r in rows if isinstance(r[1], torch.Tensor)]
        values = iter(torch.stack(tensors).tolist() if tensors else [])
        out = []
        for step, loss, lr, epoch, tokens in rows:
            value = next(values) if isinstance(loss, torch.Tensor) else float(loss)
            out.append(StepLoss(step, float(value), lr, epoch, tokens))
        return out
