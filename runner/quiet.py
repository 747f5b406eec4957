"""The runner's log says what the run does, not what its libraries will deprecate.

A job's log is what a person reads when something goes wrong (its last line is the failure they are shown),
so lines about the libraries' own future are noise there: each is filtered here by its exact start, and a
call the runner makes itself uses the libraries' current name where they have one (``enable_checkpointing``)
instead of being filtered. A warning not listed here still shows.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any

# (category, the start of the message): what the libraries say about themselves, not about this run.
LIBRARY_NOTICES: tuple[tuple[type[Warning], str], ...] = (
    # peft reads model.is_gradient_checkpointing when it wraps a model (peft_model.py, mixed_model.py);
    # transformers 5 renamed it is_activation_checkpointing
    (FutureWarning, "`is_gradient_checkpointing` is deprecated"),
    # bitsandbytes' CPU 4-bit matmul has no autograd kernel registered: PyTorch's fallback, which it says it
    # will remove (QLoRA on the local provider's CPU)
    (UserWarning, "bitsandbytes::gemv_4bit: an autograd kernel was not registered"),
)
# bitsandbytes on a CPU with AVX512-BF16 asks the Hub's `kernels` for a faster 4-bit kernel when it is
# imported (backends/cpu/ops.py), and falls back to its own: (logger, the start of its line) for each line
# of that attempt, the kernel's repository named in full
KERNEL_HUB = "kernels-community/quantization-bitsandbytes"
LIBRARY_LINES: tuple[tuple[str, str], ...] = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
    ("kernels._internals.hf_hub", f"Skipping publisher trust check for '{KERNEL_HUB}'"),
)


class _Drop(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_libraries() -> None:
    """Filter the listed notices (once per process: warnings' filters and a logger's filters are sets)."""
    for category, start in LIBRARY_NOTICES:
        warnings.filterwarnings("ignore", message=re.escape(start), category=category)
    for name, start in LIBRARY_LINES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.start == start for f in logger.filters):
            logger.addFilter(_Drop(start))


def enable_checkpointing_on(model: Any) -> None:
    """Activation checkpointing (non-reentrant) by the library's current name: transformers 5 renamed
    gradient_checkpointing_enable activation_checkpointing_enable and warns on the old one; older versions
    have only the old one."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
