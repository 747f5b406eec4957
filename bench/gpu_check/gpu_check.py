"""GPU check: train LoRA and QLoRA on a ~0.5B Llama made from a config (random weights, nothing downloaded) at
sequence length 2048 for a fixed number of steps; print tokens/s and torch.cuda.max_memory_reserved next to
the planner's estimate for the same configuration.

Uses the runner's own model loading (runner.model.load_model: bf16 base, peft LoRA / bitsandbytes NF4
with double quantization + prepare_model_for_kbit_training, gradient checkpointing) and the runner's loss
(mean over label tokens). Batches are random token ids of full length (what packing produces). Under 8
minutes on one GPU; on a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# ~0.5B parameters, Llama-3 shapes: GQA 12/4 heads of 128, SwiGLU, untied embeddings.
CONFIG = dict(vocab_size=32000, hidden_size=1536, intermediate_size=4096, num_hidden_layers=16,
              num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096,
              rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)


def planner_estimate(config_path: Path, method: str, seq_len: int, gpu_name: str) -> dict[str, float] | str:
    """The planner's memory and speed for the same job, or why it could not say."""
    try:
        from bot.planner import EstimateRequest, estimate
    except Exception as exc:  # the planner is optional here: the measurement still stands
        return f"planner unavailable ({type(exc).__name__}: {exc})"
    request = dict(model=str(config_path), method=method, lora_r=16, lora_targets="all-linear", batch_size=1,
                   seq_len=seq_len, grad_accum=1, gradient_checkpointing=True, attn="sdpa", gpus=1,
                   tokens=1_000_000)
    for gpu in (gpu_name, None):
        try:
            result = estimate(EstimateRequest(**request, gpu=gpu))
            return {"memory_gb": result.memory.per_gpu_gb,
                    "tokens_per_second": result.speed.tokens_per_second, "gpu": result.speed.gpu}
        except Exception as exc:  # unknown GPU name: retry with the planner's default
            problem = f"{type(exc).__name__}: {exc}"
    return f"planner failed ({problem})"


def gpu_alias(device_name: str) -> str:
    name = device_name.lower()
    for alias in ("h200", "h100", "a100", "l40s", "a6000", "4090", "3090"):
        if alias in name:
            return alias
    return name


def train_method(model_dir: Path, method: str, seq_len: int, steps: int, warmup: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from runner.model import load_model
    from runner.spec import JobSpec

    spec = JobSpec.model_validate({
        "job_id": f"gpu-check-{method}", "base_model": str(model_dir), "dataset": {"uri": "unused.jsonl"},
        "method": method, "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
        "seq_len": seq_len, "micro_batch_size": 1, "grad_accum": 1, "gradient_checkpointing": True,
        "attn": "sdpa", "gpus": 1, "checkpoint": {"uri": "unused"}, "output_uri": "unused",
    })
    device = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = load_model(spec, model_dir, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    generator = torch.Generator(device="cpu").manual_seed(0)
    vocab = model.config.vocab_size
    tokens = 0
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            start, tokens = time.perf_counter(), 0
        ids = torch.randint(0, vocab, (1, seq_len), generator=generator).to(device)
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += seq_len
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"tokens_per_second": tokens / seconds,
              "max_memory_reserved_gb": torch.cuda.max_memory_reserved() / 1e9,
              "max_memory_allocated_gb": torch.cuda.max_memory_allocated() / 1e9, "loss": float(loss)}
    del model, optimizer, params
    torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--methods", default="lora,qlora")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the GPU check needs one; nothing was measured")
        return 0
    from transformers import LlamaConfig, LlamaForCausalLM

    device_name = torch.cuda.get_device_name(0)
    print(f"device: {device_name}; torch {torch.__version__}; seq_len {args.seq_len}; "
          f"{args.steps} measured steps after {args.warmup} warm-up steps, micro-batch 1")
    results = {}
    with tempfile.TemporaryDirectory(prefix="tunebot-gpu-check-") as tmp:
        model_dir = Path(tmp) / "model"
        torch.manual_seed(0)
        config = LlamaConfig(**CONFIG)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: Llama from a config, random weights, {n_params:,} parameters")
        model.save_pretrained(str(model_dir))
        del model
        for method in args.methods.split(","):
            measured = train_method(model_dir, method, args.seq_len, args.steps, args.warmup)
            planned = planner_estimate(model_dir / "config.json", method, args.seq_len,
                                       gpu_alias(device_name))
            results[method] = {"measured": measured, "planner": planned}
            line = (f"{method:6s} measured {measured['tokens_per_second']:8,.0f} tok/s, "
                    f"max_memory_reserved {measured['max_memory_reserved_gb']:6.2f} GB")
            if isinstance(planned, dict):
                line += (f" | planner ({planned['gpu']}) {planned['tokens_per_second']:8,.0f} tok/s, "
                         f"{planned['memory_gb']:6.2f} GB | ratio measured/planned: "
                         f"speed {measured['tokens_per_second'] / planned['tokens_per_second']:.2f}, "
                         f"memory {measured['max_memory_reserved_gb'] / planned['memory_gb']:.2f}")
            else:
                line += f" | {planned}"
            print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": device_name, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
