"""What a job leaves behind, however it ends: its output folder, or its newest complete checkpoint.

The runner writes every checkpoint as a loadable PEFT adapter (or, for full fine-tuning, a loadable model)
with a COMPLETE marker last (runner/checkpoint.py, runner/loadable.py). A job that finished or stopped on a
plateau has an output folder; one stopped by its owner, by its budget or by a failure has only its
checkpoints, and the newest complete one is its result: what its card points at and what `resume` continues
from. The runner announces checkpoints in its events; the finish confirms the newest one by listing the
storage, so a card never names a folder that does not exist.

Reads storage with fsspec (the bot's credentials); never imports the runner's torch code.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

MARKER = "COMPLETE"  # runner/checkpoint.py's completion marker (the runner's contract)
_STEP = re.compile(r"checkpoint-(\d+)/" + MARKER + r"$")


@dataclass(frozen=True)
class Checkpoint:
    uri: str
    step: int


def newest_marked(folder_uri: str, marker_paths: list[str]) -> Checkpoint | None:
    """The newest checkpoint among marker paths ``.../checkpoint-N/COMPLETE`` (pure)."""
    steps = [int(m.group(1)) for p in marker_paths if (m := _STEP.search(p.rstrip("/")))]
    if not steps:
        return None
    step = max(steps)
    return Checkpoint(f"{folder_uri.rstrip('/')}/checkpoint-{step}", step)


def newest_checkpoint(folder_uri: str | None) -> Checkpoint | None:
    """The job's newest complete checkpoint in its checkpoint folder (None: none, or storage unreadable)."""
    if not folder_uri:
        return None
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(folder_uri)
        fs.invalidate_cache()
        markers = fs.glob(f"{root.rstrip('/')}/checkpoint-*/{MARKER}")
    except Exception as exc:  # noqa: BLE001 - storage trouble: the caller keeps what the events said
        log.warning("listing checkpoints under %s failed: %s", folder_uri, exc)
        return None
    return newest_marked(folder_uri, [str(m) for m in markers])


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
