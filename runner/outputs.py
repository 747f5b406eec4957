"""What goes into the output folder besides the weights, and where it goes after: the model card, the merged
model, the Hugging Face Hub.

- ``model_card``: README.md with the base model, the data, every hyperparameter, the final (and eval) loss
  and the cost, plus the Hub's YAML header (base_model, library_name, tags), so the folder explains itself
  in the bucket and on the Hub.
- ``merge_adapter``: the base model in 16-bit with the adapter merged in (``<output>/merged``), loaded on
  the CPU so that it never competes with training for GPU memory (it needs the 16-bit model in host RAM).

What of it is public and how it is pushed (by the bot) is the contract's: runner/contract/publish.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from runner.contract.publish import RECKONING, money, public_name
from runner.contract.spec import JobSpec, Method, RunResults


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


METHOD_TITLE = {"lora": "LoRA", "qlora": "QLoRA", "full": "Full"}
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
        ("attention", str((ran or {}).get("attention") or spec.attn)),
        *([("kernels", str(ran["kernels"]))] if ran and ran.get("kernels") else []),
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
    price = f" at {money(spec.cost.price_per_hour)}/h" if spec.cost.price_per_hour is not None else ""
    estimate = (
        f" (estimated {money(spec.cost.estimated_total)})" if spec.cost.estimated_total is not None else ""
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
        f"- cost: {money(cost)} {RECKONING}{where_ran}{price}{estimate}",
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
            f"({change_text(results.eval_before, results.eval_after)}) for {money(cost)}"
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
