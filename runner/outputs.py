"""What goes into the output folder besides the weights, and where it goes after: the model card, the merged
model, the Hugging Face Hub.

- ``model_card``: README.md with the base model, the data, every hyperparameter, the final (and eval) loss
  and the cost, plus the Hub's YAML header (base_model, library_name, tags), so the folder explains itself
  in the bucket and on the Hub.
- ``merge_adapter``: the base model in 16-bit with the adapter merged in (``<output>/merged``), loaded on
  the CPU so that it never competes with training for GPU memory (it needs the 16-bit model in host RAM).
- ``push_folder``: called by the bot, never on a host (bot/engine/hub_push.py: the host holds no token that
  can write to the Hub; the bot pushes the output its run signed, with its own token):
  ``HfApi(endpoint, token)``: create the repo (private unless the spec says public, which the bot allows
  only with an admin's approval) and claim it with a marker file naming the job (``.tunebot/job-<id>.json``);
  a repo that already exists is pushed to only when it holds this job's marker (a resumed job pushing
  again), never over a repo the job did not create. The folder goes up in one commit, with ``job.json`` and
  ``training_summary.json`` in their public form: no storage URI, local path, report address or W&B
  account (``public_spec``, ``public_summary``), and without the output's manifest; returns the URL.

Whatever is pushed names inputs as others can find them: a Hub id or ``hf://`` path as is, a local path
or a private storage URI by its last part only (``public_name``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from runner.spec import HubSpec, JobSpec, Method, RunResults

MARKER_DIR = ".tunebot"
PRIVATE_FILES = ("job.json", "training_summary.json")  # replaced by their public form in a push
NOT_PUSHED = (
    "manifest.json",
)  # the output's manifest (runner/manifest.py): the bot's check, not the model's


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


def _money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


METHOD_TITLE = {"lora": "LoRA", "qlora": "QLoRA", "full": "Full"}
RECKONING = "so far (the runner's reckoning; the bot writes the billed cost here at the end)"
BILLED = "as billed (tunebot's ledger: every instance's billed time at its locked price)"
HUB_REPO = re.compile(r"[\w.\-]+/[\w.\-]+")


def base_identity(spec: JobSpec, model_dir: Path | None) -> tuple[str | None, str]:
    """(the base model's Hub repo id, or None when none is known; how the card names it). The id is what the
    person asked for when it is one, else what the model folder's own config.json says it was saved from
    (``_name_or_path``); a folder with neither is named by its folder name and architecture."""
    asked = public_name(spec.base_model_name or spec.base_model) or "-"
    if HUB_REPO.fullmatch(asked):
        return asked, asked
    config: dict[str, Any] = {}
    if model_dir is not None:
        try:
            loaded = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
            config = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            config = {}
    saved_from = config.get("_name_or_path")
    if isinstance(saved_from, str) and HUB_REPO.fullmatch(saved_from) and "://" not in saved_from:
        return saved_from, f"{saved_from} (from the folder `{asked}`)"
    kind = config.get("model_type")
    return None, f"the {kind} model in the folder `{asked}`" if isinstance(kind, str) else f"`{asked}`"


def load_location(spec: JobSpec) -> tuple[str, str]:
    """(a comment line or "", the path or repo id from_pretrained takes): the Hub repo when pushed, else the
    output folder itself - as is on a disk, downloaded first from object storage."""
    if spec.push_to_hub:
        return "", spec.push_to_hub.repo
    out = spec.output_uri.rstrip("/")
    if "://" not in out or out.startswith("file://"):
        return "", out.removeprefix("file://")
    local = f"./{spec.job_id}-output"
    first = f"# first: fsspec.get('{out}/', '{local}/', recursive=True) (or aws s3 sync {out} {local})\n"
    return first, local


def with_billed_cost(card: str, cost: float) -> str:
    """The card with its cost line saying what the job was billed (the bot's ledger, at the job's end): the
    runner's own figure is only its reckoning while it ran."""
    lines = card.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("- cost: "):
            rest = line.removeprefix("- cost: ")
            rest = rest.split(" ", 1)[1] if rest.startswith("$") and " " in rest else ""
            rest = rest.removeprefix(RECKONING + " ")
            lines[i] = f"- cost: {_money(cost)} {BILLED} {rest}".rstrip()
    return "\n".join(lines)


def model_card(
    spec: JobSpec,
    *,
    status: str,
    steps: int,
    max_steps: int | None,
    final_loss: float | None,
    eval_loss: float | None,
    tokens: int,
    train_seconds: float,
    data: dict[str, Any] | None,
    cost: float | None,
    model_dir: Path | None = None,
    ran: dict[str, Any] | None = None,
    results: RunResults | None = None,
) -> str:
    """README.md for the output folder (and the Hub repo): the base model by its Hub id where one is known
    (``base_model:`` in the header, and in the title), a load snippet with the real repo id or folder."""
    hub_base, base = base_identity(spec, model_dir)
    dataset_name = public_name(spec.dataset.name or spec.dataset.uri)
    adapter = spec.method is not Method.full
    tags = ["tunebot", spec.method.value, *(["peft", "lora"] if adapter else [])]
    header = [
        "---",
        f"base_model: {hub_base}" if hub_base else "",
        f"library_name: {'peft' if adapter else 'transformers'}",
        "tags:",
        *(f"- {t}" for t in dict.fromkeys(tags)),
        "---",
    ]
    data = data or {}
    lora = spec.lora
    targets = lora.target_modules if isinstance(lora.target_modules, str) else ", ".join(lora.target_modules)
    steps_rule = f"max {spec.max_steps} steps" if spec.max_steps else f"{spec.epochs:g} epoch(s)"
    rows = [
        ("method", spec.method.value),
        *(
            [("LoRA", f"r {lora.r}, alpha {lora.alpha}, dropout {lora.dropout:g}, targets {targets}")]
            if adapter
            else []
        ),
        (
            "learning rate",
            f"{spec.learning_rate:g} ({spec.lr_scheduler}, warmup {spec.warmup_ratio:.0%}, "
            f"weight decay {spec.weight_decay:g})",
        ),
        ("length", steps_rule),
        ("sequence length", str(spec.seq_len)),
        ("batch", f"micro-batch {spec.micro_batch_size} x grad accumulation {spec.grad_accum} per process"),
        ("optimizer", spec.optimizer),
        ("packing", "yes" if spec.packing else "no"),
        ("activation checkpointing", "yes" if spec.gradient_checkpointing else "no"),
        ("attention", spec.attn),
        ("eval split", _eval_split(spec, data or {})),
        (
            "plateau stop",
            (
                f"on ({'eval' if (data or {}).get('eval_examples') else 'train'} loss, patience "
                f"{spec.plateau.patience})"
            )
            if spec.plateau.enabled
            else "off",
        ),
        ("seed", str(spec.seed)),
        *(
            [
                (
                    "trained on",
                    f"{ran['device']}, {ran['processes']} process(es), {ran['precision']}, "
                    f"sharding {ran['sharding']}",
                )
            ]
            if ran
            else []
        ),
    ]
    where_ran = f" on {spec.cost.where}" if spec.cost.where else ""
    price = f" at {_money(spec.cost.price_per_hour)}/h" if spec.cost.price_per_hour is not None else ""
    estimate = (
        f" (estimated {_money(spec.cost.estimated_total)})" if spec.cost.estimated_total is not None else ""
    )
    first, where = load_location(spec)
    cls, module = "AutoPeftModelForCausalLM", "peft"
    if not adapter:
        cls, module = "AutoModelForCausalLM", "transformers"
    load = first + f'from {module} import {cls}\nmodel = {cls}.from_pretrained("{where}")'
    lines = [
        *(h for h in header if h),
        "",
        f"# {spec.job_id}: {METHOD_TITLE.get(spec.method.value, spec.method.value)} fine-tune of {base}",
        "",
        "Trained with [tunebot](https://github.com/tunebot/tunebot)'s runner.",
        "",
        "## Data",
        "",
        f"- dataset: `{spec.dataset.format.value}` records from `{dataset_name}`",
        f"- records: {data.get('records', '-')} (truncated to the sequence length: "
        f"{data.get('truncated', 0)}, "
        f"dropped: {data.get('dropped', 0)}); train examples {data.get('train_examples', '-')}, "
        f"eval examples {data.get('eval_examples', 0)}",
        f"- tokens per epoch: {data.get('tokens', '-'):,}"
        if isinstance(data.get("tokens"), int)
        else "- tokens per epoch: -",
        "",
        "## Hyperparameters",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
        "## Results",
        "",
        f"- status: {status}, {steps} of {max_steps or steps} optimizer steps, {tokens:,} tokens trained",
        f"- final training loss: {_loss(final_loss)}",
        f"- eval loss: {_loss(eval_loss)}",
        f"- training time: {_duration(train_seconds)}",
        f"- cost: {_money(cost)} {RECKONING}{where_ran}{price}{estimate}",
        *evaluation_lines(results, cost=cost, eval_examples=data.get("eval_examples")),
        "",
        *sample_lines(results),
        "## Use",
        "",
        "```python",
        load,
        "```",
        "",
    ]
    return "\n".join(lines)


def _eval_split(spec: JobSpec, data: dict[str, Any]) -> str:
    """'10%', 'automatic (50 examples)', 'none' (the held-out count is the Data section's)."""
    held = data.get("eval_examples")
    fraction = spec.dataset.eval_fraction
    if fraction is not None:
        return f"{fraction:.0%}" if fraction else "none"
    return f"automatic ({held} examples)" if held else "none (automatic: datasets of 1,000+ examples)"


def change_text(before: float, after: float) -> str:
    """'-38%' (or '+4%') from an eval loss before and after."""
    return f"{(after / before - 1.0) * 100:+.0f}%" if before > 0 else "-"


def evaluation_lines(
    results: RunResults | None, *, cost: float | None, eval_examples: Any = None
) -> list[str]:
    """The card's before/after ('eval loss 2.31 -> 1.42 (-38%) for $4.10') and which step is the result."""
    if results is None:
        return []
    out: list[str] = []
    if results.eval_before is not None and results.eval_after is not None:
        held = f" on {eval_examples} held-out examples" if eval_examples else ""
        out.append(
            f"- eval loss{held}: {results.eval_before:.4f} (base model) -> {results.eval_after:.4f} "
            f"({change_text(results.eval_before, results.eval_after)}) for {_money(cost)}"
        )
    out.append(f"- result: the weights of step {results.result_step} ({results.why or results.keep})")
    return out


def _fenced(text: str) -> list[str]:
    body = (text or "-").replace("```", "` ` `")
    return ["```text", body, "```"]


def sample_lines(results: RunResults | None) -> list[str]:
    """The side-by-side answers of the base and the tuned model (greedy), one section per prompt."""
    if results is None or not results.samples:
        return []
    out = [
        "## Side by side",
        "",
        "The same prompts to the base model and to this result (greedy decoding, at most "
        f"{results.sample_tokens} new tokens).",
        "",
    ]
    for i, sample in enumerate(results.samples, 1):
        out += [f"### Prompt {i}", "", *_fenced(sample.prompt), ""]
        if sample.expected is not None:
            out += ["Held-out answer:", "", *_fenced(sample.expected), ""]
        out += ["Base model:", "", *_fenced(sample.base), "", "Tuned:", "", *_fenced(sample.tuned), ""]
    return out


def merge_adapter(adapter_dir: Path, model_dir: Path, out_dir: Path, *, dtype: Any) -> None:
    """Save the base model with the adapter merged in (16-bit, on the CPU) plus the tokenizer."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, device_map={"": "cpu"})
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(str(adapter_dir)).save_pretrained(str(out_dir))


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
