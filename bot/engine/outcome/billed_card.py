"""The model card says what the job was billed: the ledger's spend, written into the output at the job's end.

The runner writes README.md (and training_summary.json) with its own reckoning of the cost while it runs
(runner/outputs.model_card: the spend before it plus its own minutes at the locked price); the bot's ledger
bills every instance from the provider's clock to its confirmed end, boot and teardown included. When a job
ends with an output, the bot rewrites the card's cost line (runner/contract/publish.with_billed_cost) and the
summary's ``cost`` with the spend the ledger recorded, so the card, `tunebot jobs` and `tunebot spend` agree.
What is read back is the host's writing: bounded, and only the cost line is changed.
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger(__name__)

MAX_CARD_BYTES = 1 << 20


def record_billed_cost(output_uri: str, spend: float) -> bool:
    """Rewrite ``<output>/README.md``'s cost line and ``training_summary.json``'s cost; True when done."""
    import fsspec

    from runner.contract.publish import with_billed_cost

    root = output_uri.rstrip("/")
    try:
        fs, path = fsspec.core.url_to_fs(f"{root}/README.md")
        if fs.size(path) > MAX_CARD_BYTES:
            return False
        card = fs.cat_file(path).decode("utf-8", errors="replace")
        fs.pipe_file(path, with_billed_cost(card, spend).encode())
        summary_path = fs._strip_protocol(f"{root}/training_summary.json")
        if fs.exists(summary_path) and fs.size(summary_path) <= MAX_CARD_BYTES:
            summary = json.loads(fs.cat_file(summary_path))
            if isinstance(summary, dict):
                summary.update(cost=round(spend, 6), cost_source="ledger")
                fs.pipe_file(summary_path, json.dumps(summary, indent=2).encode())
    except Exception as exc:  # noqa: BLE001 - the job has ended either way; the card keeps the runner's figure
        log.warning("model card of %s: billed cost not written: %s: %s", root, type(exc).__name__, exc)
        return False
    return True
