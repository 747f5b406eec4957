"""What of a run's output is public, and how it reaches the Hub: rules the runner's model card and the bot's
push share, and the card's cost line the bot rewrites when the run ends.

- ``push_folder``: called by the bot, never on a host (bot/engine/outcome/hub_push.py: the host holds no token
  that can write to the Hub; the bot pushes the output its run signed, with its own token):
  ``HfApi(endpoint, token)``: create the repo (private unless the spec says public, which the bot allows
  only with an admin's approval) and claim it with a marker file naming the job (``.tunebot/job-<id>.json``);
  a repo that already exists is pushed to only when it holds this job's marker (a resumed job pushing
  again), never over a repo the job did not create. The folder goes up in one commit, with ``job.json`` and
  ``training_summary.json`` in their public form: no storage URI, local path, report address or W&B
  account (``public_spec``, ``public_summary``), and without the output's manifest; returns the URL.
- ``with_billed_cost``: the card's cost line as billed (the runner writes its reckoning: ``RECKONING``).

Whatever is pushed names inputs as others can find them: a Hub id or ``hf://`` path as is, a local path
or a private storage URI by its last part only (``public_name``). huggingface_hub is imported on use only.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from runner.contract.spec import HubSpec, JobSpec

MARKER_DIR = ".tunebot"
PRIVATE_FILES = ("job.json", "training_summary.json")  # replaced by their public form in a push
# The output's manifest (runner/contract/manifest.py): the bot's check, not the model's.
NOT_PUSHED = ("manifest.json",)


class PushRefused(Exception):
    """The repo exists and this job did not create it: nothing is pushed."""


def marker_path(job_id: str) -> str:
    return f"{MARKER_DIR}/job-{job_id}.json"


def public_name(value: str | None) -> str | None:
    """How a pushed file names an input: a Hub id, a name or an ``hf://`` path as is; a path on some disk
    or a URI of private storage by its last part (the bucket layout and the hosts' folders stay private)."""
    if not value:
        return value
    if value.startswith("hf://"):
        return value
    if "://" in value or value.startswith(("/", ".", "~")) or "\\" in value:
        return value.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] or "-"
    return value


def public_spec(spec: JobSpec) -> dict[str, Any]:
    """job.json as pushed: what was trained and how, without where anything lives or reports to."""
    data = json.loads(spec.redacted().model_dump_json())
    for key in ("checkpoint", "report", "output_uri", "wandb"):
        data.pop(key, None)
    data["base_model"] = public_name(spec.base_model_name or spec.base_model)
    data["base_model_name"] = data["base_model"]
    dataset = data["dataset"]
    dataset["uri"] = public_name(spec.dataset.name or spec.dataset.uri)
    dataset["name"] = dataset["uri"]
    return data


def as_ran(spec_json: dict[str, Any], ran: dict[str, Any] | None) -> dict[str, Any]:
    """job.json as the run went: the spec with its ``precision`` and ``sharding`` replaced by what trained
    (``ran``: device, processes, precision, sharding), what was asked kept under ``ran.asked``."""
    if not ran:
        return spec_json
    asked = {k: spec_json.get(k) for k in ("precision", "sharding", "gpus")}
    return {
        **spec_json,
        "precision": ran["precision"],
        "sharding": ran["sharding"],
        "ran": {**ran, "asked": asked},
    }


def public_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """training_summary.json as pushed: a resumed run says from which step, not from which folder."""
    out = dict(summary)
    if out.get("resumed_from"):
        out["resumed_from"] = public_name(str(out["resumed_from"]))
    return out


def money(value: float | None) -> str:
    """Dollars as the bot writes them (bot/money.py; the contract imports nothing of the bot)."""
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 0.01:
        return f"${value:,.2f}"
    if abs(value) >= 0.0001:
        return f"${value:.4f}"
    return f"${value:.{1 - math.floor(math.log10(abs(value)))}f}"


# The card's cost line: the runner's figure while it runs, the bot's ledger once the job ended.
RECKONING = "so far (the runner's reckoning; the bot writes the billed cost here at the end)"
BILLED = "as billed (tunebot's ledger: every instance's billed time at its locked price)"
EVAL_COST = re.compile(r"\) for \$[0-9][0-9,]*(?:\.[0-9]+)?$")  # the eval line's "for $X" (runner/outputs.py)


def with_billed_cost(card: str, cost: float) -> str:
    """The card with its cost line saying what the job was billed (the bot's ledger, at the job's end): the
    runner's own figure is only its reckoning while it ran."""
    lines = card.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("- cost: "):
            rest = line.removeprefix("- cost: ")
            rest = rest.split(" ", 1)[1] if rest.startswith("$") and " " in rest else ""
            rest = rest.removeprefix(RECKONING + " ")
            lines[i] = f"- cost: {money(cost)} {BILLED} {rest}".rstrip()
        elif line.startswith("- eval loss") and EVAL_COST.search(line):
            # "... -> 1.42 (-38%) for $4.10": what the loss bought, at the one cost the card gives
            lines[i] = EVAL_COST.sub(f") for {money(cost)}", line)
    return "\n".join(lines)


def push_folder(
    folder: Path, hub: HubSpec, spec: JobSpec, *, message: str, token: str | None, endpoint: str | None = None
) -> str:
    """Upload ``folder`` to the Hub repo this job creates (or created before a resume); returns its URL.
    Raises PushRefused when the repo exists without this job's marker. ``token``: the bot's own (HF_TOKEN);
    ``endpoint``: HF_ENDPOINT (None: the Hub)."""
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint or None, token=token or None)
    marker = marker_path(spec.job_id)
    try:
        url = api.create_repo(hub.repo, private=hub.private, exist_ok=False, repo_type="model")
    except HfHubHTTPError as exc:
        if exc.response is None or exc.response.status_code != 409:
            raise
        if not _holds_marker(api, hub.repo, marker):
            raise PushRefused(
                f"{hub.repo} already exists and this job did not create it; tunebot never pushes over a repo "
                "it did not create: choose a new repo name"
            ) from None
        url = api.create_repo(hub.repo, private=hub.private, exist_ok=True, repo_type="model")
    else:  # claim it at once: a job resumed after a preemption finds its own marker
        claim = json.dumps({"job_id": spec.job_id, "created_by": "tunebot"}).encode()
        api.upload_file(
            path_or_fileobj=claim,
            path_in_repo=marker,
            repo_id=hub.repo,
            repo_type="model",
            commit_message=f"tunebot job {spec.job_id}: repo created",
        )
    ran = _ran_of(folder)
    public = {"job.json": json.dumps(as_ran(public_spec(spec), ran), indent=2)}
    summary = folder / "training_summary.json"
    if summary.is_file():
        public["training_summary.json"] = json.dumps(
            public_summary(json.loads(summary.read_text(encoding="utf-8"))), indent=2
        )
    files = {
        p.relative_to(folder).as_posix(): p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).as_posix() not in NOT_PUSHED
    }
    for name, path in files.items():  # configs that name the base model's folder (adapter_config.json, ...)
        text = _public_config(path) if name.endswith(".json") and name not in PRIVATE_FILES else None
        if text is not None:
            public[name] = text
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
        for name, path in files.items()
        if name not in PRIVATE_FILES and name not in public
    ]
    operations += [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=text.encode()) for name, text in public.items()
    ]
    api.create_commit(repo_id=hub.repo, repo_type="model", operations=operations, commit_message=message)
    return str(url)


def _ran_of(folder: Path) -> dict[str, Any] | None:
    """What the run trained with, as its job.json in the output folder says (runner/train.py writes it)."""
    try:
        data = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ran = data.get("ran") if isinstance(data, dict) else None
    if not isinstance(ran, dict):
        return None
    return {k: v for k, v in ran.items() if k != "asked"}


PATH_KEYS = ("base_model_name_or_path", "_name_or_path", "name_or_path")


def _public_config(path: Path) -> str | None:
    """A small JSON config with the base model's path in it, rewritten with public names (else None)."""
    if path.stat().st_size > 1_000_000:
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    changed = {k: public_name(v) for k, v in config.items() if k in PATH_KEYS and isinstance(v, str)}
    if all(config[k] == v for k, v in changed.items()):
        return None
    return json.dumps({**config, **changed}, indent=2, sort_keys=True)


def _holds_marker(api: Any, repo: str, marker: str) -> bool:
    """Whether the existing repo carries this job's marker (it created the repo before a resume)."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = api.model_info(repo)
    except HfHubHTTPError:
        return False
    return any(getattr(s, "rfilename", None) == marker for s in info.siblings or [])
