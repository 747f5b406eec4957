"""The runner against the Hugging Face Trainer on one GPU (issue 37): tokens/s, peak memory and the quote.

For Llama-3.2-1B's and Llama-3.1-8B's architectures (the planner's built-in configs, random bf16 weights,
nothing downloaded), LoRA and QLoRA (r=16 on every linear layer, alpha 32) at 1,024 and 4,096 tokens, each row
trains twice on the same data, adapters and effective batch (STEP_TOKENS tokens per optimizer step):

- ``runner``: tunebot's runner as a job runs it (runner.train.run on a JobSpec), with the micro-batch,
  accumulation, checkpointing and loss the planner chose for this card (bot/planner/batch_choice.py), its
  bf16 autocast, packed rows through runner/attention.py and Liger's kernels where liger-kernel is installed;
  its own meter gives steady tokens/s (after runner/measure.py's warm-up steps) and the peak
  torch.cuda.max_memory_reserved;
- ``trainer``: transformers.Trainer with ``bf16=True`` (autocast), PEFT (QLoRA: bitsandbytes NF4 + double
  quantization and peft's prepare_model_for_kbit_training), the same micro-batch, accumulation and
  checkpointing, fused AdamW, on the same tokens packed into fixed rows (run_clm's grouping: no mask);
  tokens/s over the same steady steps, peak reserved memory the same way.

Beside them the planner's quote for the configuration (tokens/s and GB: ``quote``; the phase-by-phase quote of
issue 36 plugs in there). Every (row, stack) runs in a process of its own (clean peak memory; Liger patches
transformers' modules in the process that applies them), within one time budget (``--budget``, 450 s by
default: under 8 minutes on one H100 with start-up); rows that no longer fit the budget are printed as
skipped.
The table is printed as it fills and written as markdown (``--out``); the runner's rows also go to a
`tunebot calibrate import` file (``--calibration``).

Without a CUDA device it prints "no CUDA device" and exits 0; ``--cpu-plumbing`` runs the same code on a tiny
model on the CPU (tests/runner/test_gpu_check.py), to show the plumbing works before a GPU is at hand.

    bench/gpu_check/run.sh [--budget 450] [--out gpu_table.md] [--calibration gpu_check_calibration.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODELS = {"1b": "meta-llama/Llama-3.2-1B", "8b": "meta-llama/Llama-3.1-8B"}
# A tiny Llama for --cpu-plumbing: the same builder, tokenizer and rows, seconds on a CPU.
TINY = dict(
    model_type="llama",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
LORA_R = 16
STEP_TOKENS = 8192  # the effective batch of every row: 8 rows of 1,024 tokens, 2 of 4,096
WARMUP = 3  # runner/measure.py's warm-up steps: neither stack's first steps are counted
STEPS = 5  # measured steps after them
# The rows in the order they run: what matters most first, so a short budget still says the most.
ROWS = [
    ("1b", "lora", 1024),
    ("1b", "qlora", 1024),
    ("1b", "lora", 4096),
    ("1b", "qlora", 4096),
    ("8b", "qlora", 1024),
    ("8b", "qlora", 4096),
    ("8b", "lora", 1024),
    ("8b", "lora", 4096),
]
STACKS = ("runner", "trainer")
CARD_FOR_CPU = "h100-80gb"  # --cpu-plumbing: the planner's choice as for this card (the rows run on the CPU)


@dataclass(frozen=True)
class Row:
    model: str  # "1b" | "8b" | "tiny"
    method: str
    seq_len: int
    stack: str
    micro_batch_size: int = 1
    grad_accum: int = 1
    gradient_checkpointing: bool = True
    loss: str = "chunked"
    steps: int = STEPS
    warmup: int = WARMUP

    @property
    def rows_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum


# --- the model and the data (random weights, a word-level tokenizer: nothing downloaded) --------------------


def model_config(model: str) -> dict[str, Any]:
    if model == "tiny":
        return dict(TINY)
    from bot.planner.models import table_lookup

    hit = table_lookup(MODELS[model])
    assert hit is not None, f"{MODELS[model]} is not in the planner's table"
    return {k: v for k, v in hit.config.items() if k != "architectures"}


def build_model(model: str, folder: Path, device: str) -> Path:
    """Random bf16 weights of ``model``'s architecture and a tokenizer whose words are the vocabulary's ids
    ("t0" ... "t<vocab-1>"), saved as a model folder transformers and the runner load."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    if (folder / "config.json").exists():
        return folder
    config = AutoConfig.for_model(**model_config(model))
    torch.manual_seed(0)
    with torch.device(device):
        net = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    net.save_pretrained(str(folder))
    del net
    if device == "cuda":  # the rows run in processes of their own: give them the whole card
        torch.cuda.empty_cache()
    vocab = {f"t{i}": i for i in range(config.vocab_size - 3)}
    vocab.update(
        {"<unk>": config.vocab_size - 3, "<s>": config.vocab_size - 2, "</s>": config.vocab_size - 1}
    )
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.save_pretrained(str(folder))
    return folder


def write_data(path: Path, vocab: int, seq_len: int, tokens: int, seed: int = 0) -> Path:
    """Text documents of random words, a quarter to all of seq_len long, ``tokens`` in all: packed rows."""
    import random

    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as fh:
        written = 0
        while written < tokens:
            n = rng.randint(max(8, seq_len // 4), max(9, seq_len - 2))
            fh.write(json.dumps({"text": " ".join(f"t{rng.randrange(vocab - 3)}" for _ in range(n))}) + "\n")
            written += n
    return path


# --- the planner: its choice for the card and its quote ----------------------------------------------


def request_for(row: Row, model_name: str, step_tokens: int = STEP_TOKENS) -> Any:
    from bot.planner.request import EstimateRequest

    return EstimateRequest(
        model=model_name,
        method=row.method,
        lora_r=LORA_R,
        lora_targets="all-linear",
        seq_len=row.seq_len,
        grad_accum=max(1, step_tokens // row.seq_len),  # the effective batch; the split is the planner's
        tokens=step_tokens * (row.steps + row.warmup),
    )


def planned(row: Row, model_name: str, card: str, step_tokens: int = STEP_TOKENS) -> Row:
    """``row`` with the micro-batch, accumulation, checkpointing and loss the planner chose for ``card``."""
    from bot.planner.inputs import plan_request

    req = request_for(row, model_name, step_tokens).model_copy(update={"gpu": card})
    est = plan_request(req, offers=[])
    plan = est.training
    assert plan is not None
    return Row(
        row.model,
        row.method,
        row.seq_len,
        row.stack,
        plan.micro_batch_size,
        plan.grad_accum,
        plan.gradient_checkpointing,
        plan.loss,
        row.steps,
        row.warmup,
    )


def quote(row: Row, model_name: str, card: str, step_tokens: int = STEP_TOKENS) -> dict[str, Any]:
    """The planner's quote for this row's configuration on ``card``, by phase (bot/planner/quote.py
    ``quote_by_phase``): steady tokens/s and its range, one step, the memory range's top, the phases."""
    from bot.planner.quote import quote_by_phase

    req = request_for(row, model_name, step_tokens).model_copy(
        update={
            "batch_size": row.micro_batch_size,
            "grad_accum": row.grad_accum,
            "gradient_checkpointing": row.gradient_checkpointing,
            "loss": row.loss,
        }
    )
    return quote_by_phase(req, card)


# --- one (row, stack), in its own process -----------------------------------------------------------


def run_runner(row: Row, model_dir: Path, data: Path, work: Path) -> dict[str, Any]:
    from runner.contract.spec import JobSpec
    from runner.train import run

    spec = JobSpec.model_validate(
        {
            "job_id": f"versus-{row.model}-{row.method}-{row.seq_len}",
            "base_model": str(model_dir),
            "dataset": {"uri": str(data), "format": "text", "eval_fraction": 0.0},
            "method": row.method,
            "lora": {"r": LORA_R, "alpha": 2 * LORA_R, "dropout": 0.0, "target_modules": "all-linear"},
            "seq_len": row.seq_len,
            "micro_batch_size": row.micro_batch_size,
            "grad_accum": row.grad_accum,
            "gradient_checkpointing": row.gradient_checkpointing,
            "loss": row.loss,
            "max_steps": row.warmup + row.steps,
            "gpus": 1 if _cuda() else 0,
            "plateau": {"enabled": False},
            "samples": {"count": 0},
            "checkpoint": {"uri": str(work / "checkpoints"), "every_minutes": 10**6},
            "report": {"every_seconds": 10**6},
            "output_uri": str(work / "output"),
        }
    )
    summary, code = run(spec)
    metrics = summary.metrics or {}
    return {
        "status": "ok" if code == 0 else f"exit {code}: {summary.message}",
        "tokens_per_second": metrics.get("tokens_per_second"),
        "max_memory_reserved_gb": metrics.get("max_memory_reserved_gb"),
    }


def packed_rows(data: Path, tokenizer: Any, seq_len: int) -> list[list[int]]:
    """The same documents, tokenized and grouped into fixed rows of seq_len (run_clm's group_texts)."""
    ids: list[int] = []
    for line in data.read_text(encoding="utf-8").splitlines():
        ids.extend(tokenizer(json.loads(line)["text"])["input_ids"] + [tokenizer.eos_token_id])
    return [ids[i : i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]


def run_trainer(row: Row, model_dir: Path, data: Path, work: Path) -> dict[str, Any]:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    cuda = _cuda()
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16, "attn_implementation": "sdpa"}
    if row.method == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        kwargs["device_map"] = {"": 0 if cuda else "cpu"}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    if row.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=row.gradient_checkpointing)
    model = get_peft_model(
        model, LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, target_modules="all-linear")
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rows = packed_rows(data, tokenizer, row.seq_len)
    dataset = [{"input_ids": r, "labels": r} for r in rows]
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(work / "trainer"),
        bf16=True,
        per_device_train_batch_size=row.micro_batch_size,
        gradient_accumulation_steps=row.grad_accum,
        gradient_checkpointing=row.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        max_steps=row.warmup + row.steps,
        learning_rate=2e-4,
        lr_scheduler_type="cosine",
        warmup_steps=1,  # the runner: ceil(3% of the steps)
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        remove_unused_columns=False,
        use_cpu=not cuda,
        disable_tqdm=True,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    Trainer(model=model, args=args, train_dataset=dataset, callbacks=[Clock()]).train()
    steady = times[row.warmup - 1 :] if len(times) >= row.warmup else []
    seconds = steady[-1] - steady[0] if len(steady) > 1 else 0.0
    tokens = (len(steady) - 1) * row.rows_per_step * row.seq_len
    return {
        "status": "ok",
        "tokens_per_second": round(tokens / seconds, 3) if seconds > 0 else None,
        "max_memory_reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 4) if cuda else None,
    }


def one(row: Row, model_dir: Path, data: Path) -> dict[str, Any]:
    """One (row, stack) in this process: its figures, or the error that stopped it."""
    with tempfile.TemporaryDirectory(prefix="tunebot-versus-") as tmp:
        try:
            if row.stack == "runner":
                return run_runner(row, model_dir, data, Path(tmp))
            return run_trainer(row, model_dir, data, Path(tmp))
        except Exception as exc:  # noqa: BLE001 - a row that fails is a row of the table that says why
            return {"status": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# --- the table ----------------------------------------------------------------------------------------------

HEADER = (
    "| model | method | seq | stack | micro-batch x accum, checkpointing, loss | tok/s | peak GB | "
    "quote tok/s | quote GB (top) | runner / trainer |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def table_line(row: Row, result: dict[str, Any], quoted: dict[str, Any], ratio: float | None) -> str:
    """One markdown line: the configuration, what it measured (or why not), the quote, runner / trainer."""
    tps, mem, status = (
        result.get("tokens_per_second"),
        result.get("max_memory_reserved_gb"),
        result.get("status"),
    )
    ckpt = "on" if row.gradient_checkpointing else "off"
    config = f"{row.micro_batch_size} x {row.grad_accum}, {ckpt}, {row.loss}"
    measured = f"{tps:,.0f}" if tps else (status if status and status != "ok" else "-")
    peak = f"{mem:.2f}" if mem else "-"
    q_tps, q_mem = quoted.get("tokens_per_second"), quoted.get("memory_gb")
    quote_cells = f"{q_tps:,.0f} | {q_mem:.2f}" if q_tps and q_mem else "- | -"
    versus = f"{ratio:.2f}" if ratio else "-"
    return (
        f"| {row.model} | {row.method} | {row.seq_len:,} | {row.stack} | {config} | {measured} | {peak} | "
        f"{quote_cells} | {versus} |"
    )


def calibration_row(card: str, row: Row, model_name: str, figures: dict[str, Any]) -> dict[str, Any]:
    """The runner's row as a `tunebot calibrate import` line: the configuration that ran, what it measured."""
    from bot.engine.outcome.calibration import import_columns

    values = {
        "gpu": card,
        "gpus": 1,
        "model": model_name,
        "method": row.method,
        "stack": "hf",
        "seq_len": row.seq_len,
        "batch_size": row.micro_batch_size,
        "grad_accum": row.grad_accum,
        "lora_r": LORA_R,
        "lora_targets": "all-linear",
        "gradient_checkpointing": row.gradient_checkpointing,
        "attn": "sdpa",
        "optimizer": "adamw",
        "loss": row.loss,
        **figures,
    }
    return {k: values.get(k) for k in import_columns()}


def write_calibration(rows: list[dict[str, Any]], path: Path) -> None:
    from bot.engine.outcome.calibration import import_columns

    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=import_columns())
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def estimated_seconds(row: Row, model: str) -> float:
    """A row's rough wall time on one H100, start-up and load included: rows that no longer fit the budget
    are skipped instead of started."""
    load = {"1b": 25.0, "8b": 60.0, "tiny": 10.0}[model] + (
        20.0 if row.method == "qlora" and model == "8b" else 0
    )
    per_step = {"1b": 0.6, "8b": 4.0, "tiny": 0.2}[model] * (1.5 if row.method == "qlora" else 1.0)
    return load + per_step * (row.warmup + row.steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for every row together")
    parser.add_argument("--out", type=Path, default=Path("gpu_table.md"))
    parser.add_argument("--calibration", type=Path, default=Path("gpu_check_calibration.csv"))
    parser.add_argument(
        "--cpu-plumbing", action="store_true", help="the same code on a tiny model, on the CPU"
    )
    parser.add_argument("--step-tokens", type=int, default=STEP_TOKENS, help="tokens per optimizer step")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # internal: one (row, stack) in this process
    args = parser.parse_args(argv)
    if args.row:
        spec = json.loads(args.row)
        row = Row(**spec["row"])
        print(json.dumps(one(row, Path(spec["model_dir"]), Path(spec["data"]))), flush=True)
        return 0
    from runner.cuda_env import configure_allocator

    configure_allocator()  # the runner's allocator settings (expandable segments), before CUDA starts
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_plumbing:
        print("no CUDA device: the GPU check needs one; nothing was measured and nothing written")
        return 0
    return compare(args, cuda)


def compare(args: argparse.Namespace, cuda: bool) -> int:
    import torch

    started = time.monotonic()
    if cuda:
        props = torch.cuda.get_device_properties(0)
        card = planner_gpu(props.name, props.total_memory / 1e9) or "h100-80gb"  # (its name: the table's)
        device = f"{props.name} ({props.total_memory / 1e9:.1f} GB), torch {torch.__version__}"
        plan_rows = ROWS
    else:
        card, device = CARD_FOR_CPU, f"CPU plumbing (choices and quotes as for {CARD_FOR_CPU})"
        plan_rows = [("tiny", "lora", 64), ("tiny", "qlora", 128)]
    steps = STEPS if cuda else 2
    print(
        f"device: {device}; planner GPU {card}; {args.step_tokens:,} tokens per step, {steps} steps measured"
    )
    print(HEADER, flush=True)
    lines, calibration, ran_on = [HEADER], [], []
    with tempfile.TemporaryDirectory(prefix="tunebot-versus-models-") as tmp:
        folders: dict[str, Path] = {}
        for model, method, seq_len in plan_rows:
            name = str(Path(tmp) / model / "model") if model == "tiny" else MODELS[model]
            base = Row(model, method, seq_len, "runner", steps=steps)
            if time.monotonic() - started + 2 * estimated_seconds(base, model) > args.budget:
                line = f"| {model} | {method} | {seq_len:,} | both | - | skipped: the time budget | | | | |"
                print(line, flush=True)
                lines.append(line)
                _save(args.out, lines)  # as it fills: a run cut short still leaves its rows
                continue
            if model not in folders:
                folders[model] = build_model(model, Path(tmp) / model / "model", "cuda" if cuda else "cpu")
            if model == "tiny":
                name = str(folders[model] / "config.json")
            vocab = int(model_config(model)["vocab_size"])
            data = write_data(
                Path(tmp) / f"{model}-{seq_len}.jsonl",
                vocab,
                seq_len,
                args.step_tokens * (base.steps + base.warmup + 2),
            )
            row = planned(base, name, card, args.step_tokens)
            quoted = quote(row, name, card, args.step_tokens)
            figures: dict[str, dict[str, Any]] = {}
            for stack in STACKS:
                one_row = Row(**{**asdict(row), "stack": stack})
                left = args.budget - (time.monotonic() - started)
                if left < 10:
                    figures[stack] = {"status": "skipped: the time budget"}
                    continue
                figures[stack] = _in_process(one_row, folders[model], data, timeout=left)
            runner_tps = figures["runner"].get("tokens_per_second")
            trainer_tps = figures["trainer"].get("tokens_per_second")
            ratio = runner_tps / trainer_tps if runner_tps and trainer_tps else None
            for stack in STACKS:
                line = table_line(Row(**{**asdict(row), "stack": stack}), figures[stack], quoted, ratio)
                print(line, flush=True)
                lines.append(line)
                _save(args.out, lines)  # as it fills: a run cut short still leaves its rows
            if figures["runner"].get("ran_on"):
                ran_on.append(f"- {model} {method} {seq_len:,}: " + "; ".join(figures["runner"]["ran_on"]))
            measured = {k: v for k, v in figures["runner"].items() if k not in ("status", "ran_on")}
            if figures["runner"].get("tokens_per_second") and model != "tiny":
                calibration.append(calibration_row(card, row, name, measured))
    if ran_on:
        lines += ["", "What the runner's rows ran on (their logs' lines):", *ran_on]
    lines.append(f"\n{device}; {time.monotonic() - started:.0f} s in all.")
    _save(args.out, lines)
    print(f"wrote {args.out}")
    if calibration:
        write_calibration(calibration, args.calibration)
        print(f"wrote {args.calibration}: `tunebot calibrate import {args.calibration}` feeds the planner")
    return 0


def planner_gpu(device_name: str, total_memory_gb: float) -> str | None:
    """The planner's name for a CUDA device (bench/gpu_check/gpu_check.py's mapping)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).with_name("gpu_check.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.planner_gpu(device_name, total_memory_gb)


# The runner's log lines that say which kernels a row ran on (runner/attention.py, runner/kernels.py)
RAN_ON = ("attention:", "kernels:", "loss:")


def _save(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _in_process(row: Row, model_dir: Path, data: Path, *, timeout: float) -> dict[str, Any]:
    """One (row, stack) in a fresh process (its own peak memory, nothing patched by the previous one)."""
    spec = json.dumps({"row": asdict(row), "model_dir": str(model_dir), "data": str(data)})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
    }
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false"
    )
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--row", spec],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        return {"status": f"stopped after {timeout:.0f} s (the time budget)"}
    said: list[str] = []  # each part once ("kernels: ...; loss: ..." and "loss: ..." say the loss twice)
    for line in done.stdout.splitlines():
        if line.startswith(RAN_ON):
            said += [part for part in line.split("; ") if part not in said]
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return {**json.loads(line), "ran_on": said}
            except json.JSONDecodeError:
                break
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"status": f"exit {done.returncode}: {tail[0][:200]}"}


if __name__ == "__main__":
    raise SystemExit(main())
