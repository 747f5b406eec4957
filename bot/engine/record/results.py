"""What a job leaves behind, however it ends: its output folder, or its newest acknowledged checkpoint.

The runner writes every checkpoint as a loadable PEFT adapter (or, for full fine-tuning, a loadable model)
with a COMPLETE marker last (runner/checkpoint.py, runner/loadable.py). A job that finished or stopped on a
plateau has an output folder; one stopped by its owner, by its budget or by a failure has only its
checkpoints, and the newest one the bot acknowledged from its run (bot/engine/record/runs.py) is its result:
what its card points at and what `resume` continues from. The finish confirms it is still in storage (its
COMPLETE marker), so a card never names a folder that does not exist.

Reads storage with fsspec (the bot's credentials); never imports the runner's torch code.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

MARKER = "COMPLETE"  # runner/checkpoint.py's completion marker (the runner's contract)


def exists(uri: str | None) -> bool:
    """Whether a folder or object is there (False when it is not, or cannot be read)."""
    if not uri:
        return False
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(uri)
        return bool(fs.exists(root))
    except Exception as exc:  # noqa: BLE001
        log.warning("checking %s failed: %s", uri, exc)
        return False


def how_to_load(method: str, base: str, uri: str) -> str:
    """One line of Python that loads the result (the card's hint)."""
    if method == "full":
        return f'AutoModelForCausalLM.from_pretrained("{uri}")'
    return f'PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("{base}"), "{uri}")'
