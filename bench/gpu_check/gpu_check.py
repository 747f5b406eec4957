"""GPU check: measure peak memory and tokens/s of LoRA and QLoRA at two sequence lengths, with each loss
the runner has (runner/loss.py: chunked, plain, and Liger's kernel where liger-kernel and Triton are
installed), on whatever GPU is here, print them next to the planner's estimate, and write them in the
`tunebot calibrate import` format.

The model is Llama-3.2-1B's architecture from the planner's built-in table (bot/planner/data/models.json) with
random bf16 weights - nothing is downloaded - so the rows it writes resolve on any tunebot install. Training
goes through the runner's own model loading (runner.model.load_model: bf16 base + peft LoRA, or bitsandbytes
NF4 with double quantization + prepare_model_for_kbit_training), with gradient checkpointing, SDPA,
micro-batch 1, fused AdamW and expandable segments (as the runner), and the runner's meter (runner/measure.py:
steady tokens/s after warm-up steps, peak torch.cuda.max_memory_reserved, device memory in use). Batches are
random token ids of full length (what packing produces). On a machine without CUDA it says so and exits 0
without writing anything.

    bench/gpu_check/run.sh [--steps 20] [--seq-lens 1024,4096] [--losses chunked,plain,liger]
                           [--out gpu_check_calibration.csv]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODEL = "meta-llama/Llama-3.2-1B"
LORA_R = 16
# The configuration every row shares (EstimateRequest fields), beside method and seq_len.
REQUEST = dict(
    model=MODEL,
    stack="hf",
    batch_size=1,
    grad_accum=1,
    lora_r=LORA_R,
    lora_targets="all-linear",
    gradient_checkpointing=True,
    attn="sdpa",
    optimizer="adamw",
)


def planner_gpu(device_name: str, total_memory_gb: float) -> str | None:
    """The planner's name for a CUDA device ("NVIDIA A100-SXM4-40GB", 42.4 GB -> a100-40gb), or None."""
    name = device_name.lower()
    if "h200" in name:
        return "h200"
    if "h100" in name:
        return "h100-80gb"
    if "a100" in name:
        return "a100-40gb" if total_memory_gb < 60 else "a100-80gb"
    if "l40s" in name:
        return "l40s"
    if "6000 ada" in name:
        return "rtx-6000-ada"
    if "a6000" in name:
        return "rtx-a6000"
    for card in ("4090", "3090"):
        if card in name:
            return f"rtx-{card}"
    return None


def calibration_rows(gpu: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One `calibrate import` row per measured configuration (method, seq_len and the measured figures)."""
    from bot.engine.outcome.calibration import import_columns

    rows = []
    for r in results:
        row = {
            **REQUEST,
            "gpu": gpu,
            "gpus": 1,
            "method": r["method"],
            "seq_len": r["seq_len"],
            "loss": r.get("loss", "plain"),
        }
        for key in ("max_memory_reserved_gb", "device_memory_used_gb", "tokens_per_second", "mfu"):
            row[key] = r.get(key)
        rows.append({k: row.get(k) for k in import_columns()})
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    from bot.engine.outcome.calibration import import_columns

    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=import_columns())
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def planner_figures(
    gpu: str | None, method: str, seq_len: int, loss: str = "plain"
) -> dict[str, float] | None:
    """The planner's physics for the same configuration (torch-reserved GB, tokens/s, MFU)."""
    if gpu is None:
        return None
    from bot.planner.gpus import gpu as lookup
    from bot.planner.memory import estimate_memory
    from bot.planner.models import resolve
    from bot.planner.request import EstimateRequest
    from bot.planner.speed import estimate_speed

    req = EstimateRequest(**REQUEST, method=method, seq_len=seq_len, loss=loss)
    arch, _ = resolve(MODEL)
    speed = estimate_speed(arch, req, lookup(gpu))
    return {
        "memory_gb": estimate_memory(arch, req).torch_reserved_gb,
        "tokens_per_second": speed.tokens_per_second,
        "mfu": speed.mfu,
    }


def train(
    model_dir: Path, method: str, seq_len: int, steps: int, warmup: int, loss_kind: str = "plain"
) -> dict[str, float | None]:
    import torch

    from runner import measure
    from runner.contract.spec import JobSpec
    from runner.loss import HeadLoss
    from runner.model import load_model

    spec = JobSpec.model_validate(
        {
            "job_id": f"gpu-check-{method}-{seq_len}",
            "base_model": str(model_dir),
            "dataset": {"uri": "unused.jsonl"},
            "method": method,
            "lora": {"r": LORA_R, "alpha": 2 * LORA_R, "dropout": 0.0, "target_modules": "all-linear"},
            "seq_len": seq_len,
            "micro_batch_size": 1,
            "grad_accum": 1,
            "gradient_checkpointing": True,
            "attn": "sdpa",
            "gpus": 1,
            "checkpoint": {"uri": "unused"},
            "output_uri": "unused",
        }
    )
    device = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = load_model(spec, model_dir, device)
    model.train()  # from_pretrained leaves eval mode, where transformers skips gradient checkpointing
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)  # as the runner (runner/train.py)
    generator = torch.Generator(device="cpu").manual_seed(0)
    vocab = model.config.vocab_size
    meter = measure.RunMeter(device, warmup=warmup)
    head = HeadLoss(model, loss_kind, model.config)  # the runner's loss, as it trains with it
    for _ in range(warmup + steps):
        ids = torch.randint(0, vocab, (1, seq_len), generator=generator).to(device)
        torch.cuda.synchronize()
        started = time.perf_counter()
        loss = head(model, {"input_ids": ids}, ids) / (seq_len - 1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)  # the runner reads the loss back every step
        meter.step(seq_len, time.perf_counter() - started)
    result = meter.result()
    head.remove()
    del model, optimizer, params, head
    torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="1024,4096")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--methods", default="lora,qlora")
    parser.add_argument(
        "--losses",
        default="chunked,plain,liger",
        help="runner losses to measure; liger is skipped where liger-kernel is missing",
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check_calibration.csv"))
    args = parser.parse_args()
    from runner.cuda_env import configure_allocator

    configure_allocator()  # the runner's allocator settings, before CUDA starts (expandable segments)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the GPU check needs one; nothing was measured and nothing written")
        return 0
    from transformers import AutoConfig, AutoModelForCausalLM

    from bot.planner.models import table_lookup

    props = torch.cuda.get_device_properties(0)
    device_name, total_gb = props.name, props.total_memory / 1e9
    gpu = planner_gpu(device_name, total_gb)
    print(
        f"device: {device_name} ({total_gb:.1f} GB) -> planner GPU {gpu or 'unknown (rows not written)'}; "
        f"torch {torch.__version__}; {args.steps} measured steps after {args.warmup} warm-up steps, "
        "micro-batch 1"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="tunebot-gpu-check-") as tmp:
        model_dir = Path(tmp) / "model"
        hit = table_lookup(MODEL)
        assert hit is not None, f"{MODEL} is not in the planner's table"
        cfg = hit.config
        config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        print(
            f"model: {MODEL}'s architecture, random weights, {sum(p.numel() for p in model.parameters()):,} "
            "parameters"
        )
        model.save_pretrained(str(model_dir))
        del model
        from runner.kernels import liger_problem

        losses = [k for k in args.losses.split(",") if k != "liger" or liger_problem() is None]
        if "liger" in args.losses.split(",") and "liger" not in losses:
            print("loss=liger skipped: liger-kernel (and Triton) not installed here")
        for method, seq_len, loss_kind in (
            (m, int(s), k) for m in args.methods.split(",") for s in args.seq_lens.split(",") for k in losses
        ):
            measured = train(model_dir, method, seq_len, args.steps, args.warmup, loss_kind)
            planned = planner_figures(gpu, method, seq_len, loss_kind)
            row = {"method": method, "seq_len": seq_len, "loss": loss_kind, **measured}
            line = (
                f"{method:6s} seq {seq_len:6d} {loss_kind:7s}: "
                f"{measured['tokens_per_second'] or 0:9,.0f} tok/s, "
                f"max_memory_reserved {measured['max_memory_reserved_gb'] or 0:6.2f} GB, device used "
                f"{measured['device_memory_used_gb'] or 0:6.2f} GB"
            )
            if planned:
                tps, mem = measured["tokens_per_second"] or 0.0, measured["max_memory_reserved_gb"] or 0.0
                row["mfu"] = round(planned["mfu"] * tps / planned["tokens_per_second"], 4)
                line += (
                    f" | planner {planned['tokens_per_second']:9,.0f} tok/s, "
                    f"{planned['memory_gb']:6.2f} GB"
                    f" | measured/planned: speed {tps / planned['tokens_per_second']:.2f}, "
                    f"memory {mem / planned['memory_gb']:.2f}"
                )
            print(line, flush=True)
            results.append(row)
    if gpu is None:
        print("this GPU is not in the planner's table: no calibration file written")
        return 0
    write_csv(calibration_rows(gpu, results), args.out)
    print(
        f"wrote {args.out} ({len(results)} rows): feed the planner with `tunebot calibrate import {args.out}`"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
