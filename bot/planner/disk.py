"""The disk a job's host needs, from what the runner writes there (pure).

The runner image unpacked, the base model's weights as downloaded (16-bit safetensors into the Hugging Face
cache), one checkpoint at a time (written to a temporary folder, uploaded to TUNEBOT_CHECKPOINT_URI, then
removed: the kept ones live in object storage), the dataset and its tokenized form, and the final output
(the adapter, or the whole model after a full fine-tune, plus the merged model with merge=yes), with headroom
for the OS, logs and pip and Hub temporaries. A flat 100 GB held neither a 70B model's 141 GB of weights nor
left the small jobs their money.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9
IMAGE_GB = 12.0  # the runner image unpacked (pytorch 2.8 CUDA 12.8 runtime + the runner's extras)
DOWNLOAD_BYTES_PER_PARAM = 2.0  # hub checkpoints are 16-bit (bf16 / fp16 safetensors)
TOKEN_BYTES = 8.0  # per token: its text (~4 bytes) and its ids
HEADROOM = 0.20  # on top of what is counted
HEADROOM_GB = 10.0  # OS, logs, pip and Hub temporaries
MIN_DISK_GB = 50.0
ROUND_GB = 10.0


@dataclass(frozen=True)
class DiskNeed:
    """GB the host's disk must hold, by part; ``gb`` is what a launch asks for (rounded up)."""

    image: float
    weights: float
    checkpoints: float
    data: float
    outputs: float
    headroom: float
    gb: float

    def breakdown(self) -> dict[str, float]:
        parts = {
            "image": self.image,
            "weights": self.weights,
            "checkpoints": self.checkpoints,
            "data": self.data,
            "outputs": self.outputs,
            "headroom": self.headroom,
        }
        return {k: round(v, 2) for k, v in parts.items()}


def disk_need(
    *,
    parameters: int,
    trainable: int,
    checkpoint_bytes: float,
    method: str,
    merge: bool,
    tokens: int,
    dataset_bytes: int | None = None,
) -> DiskNeed:
    """The disk for one job: ``checkpoint_bytes`` is one resumable checkpoint (trainable weights + optimizer
    states, bot/planner/memory.py); the output is the adapter in fp32, or the full model in 16-bit."""
    weights = parameters * DOWNLOAD_BYTES_PER_PARAM / GB
    checkpoints = checkpoint_bytes / GB
    data = max(float(dataset_bytes or 0), 0.0) / GB + tokens * TOKEN_BYTES / GB
    outputs = (parameters * 2.0 if method == "full" else trainable * 4.0) / GB
    if merge and method != "full":
        outputs += parameters * 2.0 / GB  # <output>/merged: the base model with the adapter folded in
    counted = IMAGE_GB + weights + checkpoints + data + outputs
    headroom = counted * HEADROOM + HEADROOM_GB
    gb = max(MIN_DISK_GB, math.ceil((counted + headroom) / ROUND_GB) * ROUND_GB)
    return DiskNeed(IMAGE_GB, weights, checkpoints, data, outputs, headroom, float(gb))
