"""GPU check of the memory mechanisms of issue 29, each measured beside the planner's estimate for the same
configuration (one prepared script, under 4 minutes on an H200; nothing is downloaded).

Sections (each in its own process, so PYTORCH_CUDA_ALLOC_CONF is set before CUDA starts):

  alloc   the caching allocator with batches of varying length: Llama-3.2-1B's architecture (random bf16
          weights), LoRA r=16 all-linear (peft, fp32 adapters), gradient checkpointing, SDPA, micro-batch 2,
          the plain loss (logits upcast to fp32, what the published stacks do), fused AdamW; at 4,096 and
          8,192 tokens: fixed-length batches (packing), varying lengths padded to the longest row (the
          runner's unpacked batches), and the same lengths grouped by length ("bucketed": the runner's
          unpacked plan since issue 29, when runner.contract.packing has it). Twice: default allocator and
          `expandable_segments:True`. Measured: torch.cuda.max_memory_allocated, max_memory_reserved, and the
          device memory in use outside torch's pool (CUDA context, cuBLAS handles: device-used convention =
          reserved + that). The default-allocator run records the allocator's own trace
          (torch.cuda.memory._record_memory_history) and writes it to $OUT/alloc_trace.json.gz, so the
          planner's emulator (bot/planner/allocator.py) can be checked against the real allocator's reserved
          on the same request sequence.
  optim   the optimizer step's temporaries: a full fine-tune of the same model in pure bf16 and in mixed
          precision (fp32 master weights + bf16 autocast), torch.optim.AdamW foreach vs fused: the allocated
          growth during optimizer.step() and the peak of the whole step.
  qlora   QLoRA through the runner's own loader (runner.model.load_model: bitsandbytes NF4, double quant,
          prepare_model_for_kbit_training) at 4,096 tokens, plain and chunked loss; and one bitsandbytes
          Linear4bit (8,192 x 28,672) with quant_storage uint8 and bfloat16 (what FSDP needs): the transient
          its forward and backward allocate beyond the input (the dequantized bf16 weight, 2 B/param).

Run (on the GPU machine, from the repository root, with the runner extra installed):

    timeout 300 python bench/gpu_check/mechanisms.py --out "$OUT"

Prints one compact table per section and writes $OUT/mechanisms.json (every row: the configuration as an
EstimateRequest dict, the measured figures in bytes, and the planner's estimate at run time) and
$OUT/alloc_trace.json.gz. Without CUDA it says so and exits 0 (`--smoke` runs every code path on the CPU
with a tiny model, for tests).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MODEL = "meta-llama/Llama-3.2-1B"
LORA_R = 16
TINY = {  # --smoke: the same code paths on the CPU in seconds
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": True,
    "head_dim": 16,
}
MARK = 7 * 1024 * 1024 + 4096 * 3  # a marker allocation's size (bytes): config boundaries in the trace
GB = 1e9


# ---- the child processes


class Mem:
    """torch.cuda's memory counters, zeros on the CPU (--smoke)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset(self) -> None:
        self.sync()
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def figures(self) -> dict[str, int]:
        self.sync()
        if not self.cuda:
            return {"peak_allocated": 0, "peak_reserved": 0, "outside_torch": 0, "alloc_retries": 0}
        free, total = self.torch.cuda.mem_get_info()
        stats = self.torch.cuda.memory_stats()
        return {
            "peak_allocated": self.torch.cuda.max_memory_allocated(),
            "peak_reserved": self.torch.cuda.max_memory_reserved(),
            # device memory in use that is not torch's pool: CUDA context, cuBLAS/cuDNN handles, NCCL
            "outside_torch": (total - free) - self.torch.cuda.memory_reserved(),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        }


def _config(smoke: bool) -> dict[str, Any]:
    if smoke:
        return dict(TINY)
    from bot.planner.models import table_lookup

    hit = table_lookup(MODEL)
    assert hit is not None
    return {k: v for k, v in hit.config.items() if k != "architectures"}


def _build(cfg: dict[str, Any], device: Any, dtype: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    return model


def _batch(widths: list[int], rows: list[int], vocab: int, device: Any, gen: Any) -> dict[str, Any]:
    """A micro-batch as the runner builds an unpacked one: rows of `rows` tokens padded to the width."""
    import torch

    width = max(widths)
    ids = torch.randint(0, vocab, (len(rows), width), generator=gen)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, n in enumerate(rows):
        mask[r, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def lengths_for(max_len: int, n: int, seed: int) -> list[int]:
    """Example lengths of a long-context dataset: log-normal, median a third of the cap, capped."""
    rng = random.Random(seed)
    return [max(16, min(max_len, int(rng.lognormvariate(math.log(max_len / 3), 0.8)))) for _ in range(n)]


def plans(max_len: int, batch: int, steps: int, seed: int) -> dict[str, list[list[int]]]:
    """Micro-batches (example lengths per row) for the three batch shapes."""
    lengths = lengths_for(max_len, batch * steps, seed)
    shuffled = [lengths[i : i + batch] for i in range(0, len(lengths), batch)]
    out = {"fixed": [[max_len] * batch for _ in range(3)], "variable": shuffled}
    try:  # the runner's unpacked plan (issue 29: grouped by length) when it has one
        from runner.contract.packing import epoch_rng, plan_unpacked

        plan = plan_unpacked(lengths, micro_batch_size=batch, rng=epoch_rng(seed, 0))
        out["bucketed"] = [[lengths[row[0]] for row in rows] for rows in plan]
    except Exception as exc:  # noqa: BLE001 - an older runner: no third shape
        print(f"bucketed plan unavailable: {exc}", flush=True)
    return out


def child_alloc(args: argparse.Namespace, out: list[dict[str, Any]]) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    from runner.loss import HeadLoss

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mem = Mem(device)
    cfg = _config(args.smoke)
    trace = mem.cuda and args.trace
    if trace:
        torch.cuda.memory._record_memory_history(
            enabled="all", context=None, stacks="python", max_entries=3_000_000
        )
    model = _build(cfg, device, torch.bfloat16 if mem.cuda else torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, target_modules="all-linear"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, fused=True if mem.cuda else None)
    head = HeadLoss(model, "plain", model.config)
    gen = torch.Generator().manual_seed(0)
    lens = (128, 256) if args.smoke else (4096, 8192)
    mark = 0
    for max_len in lens:
        for shape, batches in plans(max_len, 2, args.steps, seed=max_len).items():
            if time.time() > args.deadline:
                print("alloc: out of time, skipping the rest", flush=True)
                return
            mem.reset()
            if trace:  # a marker allocation: where this configuration starts in the trace
                marker = torch.empty(MARK + 512 * mark, dtype=torch.uint8, device=device)
                del marker
            mark += 1
            t0 = time.time()
            widths = []
            for rows in batches:
                inputs = _batch(rows, rows, model.config.vocab_size, device, gen)
                widths.append(inputs["input_ids"].shape[1])
                labels = inputs.pop("labels")
                loss = head(model, inputs, labels) / max(1, int((labels != -100).sum()))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del loss, inputs, labels
            row = {
                "section": "alloc",
                "expandable": args.expandable,
                "shape": shape,
                "max_len": max_len,
                "steps": len(batches),
                "widths": widths,
                "mark": mark - 1,
                "seconds": round(time.time() - t0, 1),
                "request": {
                    "model": MODEL,
                    "method": "lora",
                    "lora_r": LORA_R,
                    "batch_size": 2,
                    "seq_len": max(widths),
                    "loss": "plain",
                    "packing": shape == "fixed",
                    "length_grouping": shape == "bucketed",
                    "expandable_segments": args.expandable,
                    "optimizer_impl": "fused",
                },
                **mem.figures(),
            }
            out.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("widths", "request")}), flush=True)
    if trace:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        codes = {"alloc": 0, "free_completed": 1, "segment_alloc": 2, "segment_free": 3}
        addrs: dict[int, int] = {}
        events = []
        count = 0  # a fresh id per allocation (an address is reused once freed)
        for entry in snap["device_traces"][0]:
            code = codes.get(entry.get("action"))
            if code is None:
                continue
            if code in (0, 1):
                if code == 0:
                    count += 1
                    addrs[entry["addr"]] = ident = count
                else:
                    ident = addrs.pop(entry["addr"], None)
                if ident is None:
                    continue
                events.append([code, ident, int(entry["size"])])
            else:
                events.append([code, 0, int(entry["size"])])
        with gzip.open(Path(args.work) / "alloc_trace.json.gz", "wt") as fh:
            json.dump({"mark_size": MARK, "events": events}, fh)


def child_optim(args: argparse.Namespace, out: list[dict[str, Any]]) -> None:
    import torch

    from runner.loss import HeadLoss

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mem = Mem(device)
    cfg = _config(args.smoke)
    seq = 64 if args.smoke else 1024
    gen = torch.Generator().manual_seed(0)
    for precision in ("bf16", "mixed"):
        for impl in ("foreach", "fused"):
            if time.time() > args.deadline:
                print("optim: out of time, skipping the rest", flush=True)
                return
            if impl == "fused" and not mem.cuda:
                continue
            mem.reset()
            dtype = torch.bfloat16 if precision == "bf16" and mem.cuda else torch.float32
            model = _build(cfg, device, dtype)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=1e-5, foreach=impl == "foreach", fused=impl == "fused"
            )
            head = HeadLoss(model, "plain", model.config)
            step_growth = 0
            for _ in range(3):
                inputs = _batch([seq, seq], [seq, seq], model.config.vocab_size, device, gen)
                labels = inputs.pop("labels")
                ctx = (
                    torch.autocast("cuda", dtype=torch.bfloat16)
                    if precision == "mixed" and mem.cuda
                    else None
                )
                if ctx is not None:
                    with ctx:
                        loss = head(model, inputs, labels) / labels.numel()
                else:
                    loss = head(model, inputs, labels) / labels.numel()
                loss.backward()
                del loss, inputs, labels
                mem.sync()
                before = mem.allocated()
                if mem.cuda:
                    peak_so_far = torch.cuda.max_memory_allocated()
                    torch.cuda.reset_peak_memory_stats()  # the step's own peak; the run's is kept below
                optimizer.step()
                mem.sync()
                if mem.cuda:
                    step_growth = max(step_growth, torch.cuda.max_memory_allocated() - before)
                    run_peak = max(peak_so_far, torch.cuda.max_memory_allocated())
                optimizer.zero_grad(set_to_none=True)
            figures = mem.figures()
            if mem.cuda:
                figures["peak_allocated"] = max(figures["peak_allocated"], run_peak)
            params = sum(p.numel() for p in model.parameters())
            row = {
                "section": "optim",
                "precision": precision,
                "optimizer_impl": impl,
                "parameters": params,
                "step_growth": step_growth,
                "step_growth_per_param": round(step_growth / params, 3),
                "request": {
                    "model": MODEL,
                    "method": "full",
                    "precision": precision,
                    "batch_size": 2,
                    "seq_len": seq,
                    "loss": "plain",
                    "packing": True,
                    "optimizer_impl": impl,
                },
                **figures,
            }
            out.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "request"}), flush=True)
            del model, optimizer, head


def child_qlora(args: argparse.Namespace, out: list[dict[str, Any]]) -> None:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mem = Mem(device)
    if not mem.cuda:
        print("qlora: needs CUDA (bitsandbytes); skipped", flush=True)
        return
    import bitsandbytes as bnb

    # one Linear4bit: what its forward and backward allocate beyond the input and output
    d_in, d_out = 8192, 28672
    for storage in (torch.uint8, torch.bfloat16):
        mem.reset()
        layer = bnb.nn.Linear4bit(
            d_in, d_out, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4", quant_storage=storage
        )
        layer.weight = bnb.nn.Params4bit(
            torch.randn(d_out, d_in, dtype=torch.bfloat16) * 0.02,
            requires_grad=False,
            quant_type="nf4",
            quant_storage=storage,
        )
        layer = layer.to(device)
        x = torch.randn(1, 16, d_in, dtype=torch.bfloat16, device=device, requires_grad=True)
        mem.sync()
        torch.cuda.reset_peak_memory_stats()
        base = mem.allocated()
        y = layer(x)
        fwd = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        base2 = mem.allocated()
        y.sum().backward()
        bwd = torch.cuda.max_memory_allocated() - base2
        row = {
            "section": "dequant",
            "quant_storage": str(storage).removeprefix("torch."),
            "params": d_in * d_out,
            "weight_bytes": int(layer.weight.numel() * layer.weight.element_size()),
            "forward_transient": fwd,
            "backward_transient": bwd,
            "forward_per_param": round(fwd / (d_in * d_out), 3),
            "backward_per_param": round(bwd / (d_in * d_out), 3),
        }
        out.append(row)
        print(json.dumps(row), flush=True)
        del layer, x, y
    # the runner's own QLoRA path on the saved random checkpoint
    from runner.contract.spec import JobSpec
    from runner.loss import HeadLoss
    from runner.model import load_model

    for loss_kind in ("plain", "chunked"):
        if time.time() > args.deadline:
            print("qlora: out of time, skipping the rest", flush=True)
            return
        seq = 4096
        spec = JobSpec.model_validate(
            {
                "job_id": f"mech-qlora-{loss_kind}",
                "base_model": str(args.model_dir),
                "dataset": {"uri": "unused.jsonl"},
                "method": "qlora",
                "lora": {"r": LORA_R, "alpha": 2 * LORA_R, "dropout": 0.0, "target_modules": "all-linear"},
                "seq_len": seq,
                "micro_batch_size": 1,
                "grad_accum": 1,
                "gradient_checkpointing": True,
                "attn": "sdpa",
                "gpus": 1,
                "checkpoint": {"uri": "unused"},
                "output_uri": "unused",
            }
        )
        mem.reset()
        model = load_model(spec, Path(args.model_dir), device)
        model.train()  # from_pretrained returns an eval-mode model, which skips checkpointing (as the runner)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
        head = HeadLoss(model, loss_kind, model.config)
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            ids = torch.randint(0, model.config.vocab_size, (1, seq), generator=gen).to(device)
            loss = head(model, {"input_ids": ids}, ids) / seq
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss
        row = {
            "section": "qlora",
            "loss": loss_kind,
            "request": {
                "model": MODEL,
                "method": "qlora",
                "lora_r": LORA_R,
                "batch_size": 1,
                "seq_len": seq,
                "loss": loss_kind,
                "packing": True,
                "optimizer_impl": "fused",
            },
            **mem.figures(),
        }
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "request"}), flush=True)
        head.remove()
        del model, optimizer, params, head


CHILDREN = {"alloc": child_alloc, "optim": child_optim, "qlora": child_qlora}


# ---- the parent: children, the planner beside each row, the emulator on the trace


def planned(request: dict[str, Any], smoke: bool) -> dict[str, Any] | None:
    """The planner's estimate for a row's configuration (fields this planner version lacks are left out)."""
    if smoke:
        return None
    from bot.planner.memory import estimate_memory
    from bot.planner.models import resolve
    from bot.planner.request import EstimateRequest

    fields = EstimateRequest.model_fields
    req = EstimateRequest(**{k: v for k, v in request.items() if k in fields})
    m = estimate_memory(resolve(req.model)[0], req)
    return {
        "torch_reserved": m.per_gpu_bytes - m.breakdown.get("cuda_context", 0.0),
        "device": m.per_gpu_bytes,
        "phase": m.peak_phase,
        "breakdown": {k: round(v) for k, v in m.breakdown.items()},
        "ignored_fields": sorted(k for k in request if k not in fields),
    }


def replay_trace(path: Path) -> list[dict[str, Any]]:
    """The real allocator's trace replayed through the planner's emulator (bot/planner/allocator.py), default
    and expandable segments, as the child ran it: at each configuration's marker the cache is emptied
    (torch.cuda.empty_cache) and the peaks reset; per configuration the emulated peaks."""
    from bot.planner import allocator

    data = json.loads(gzip.open(path, "rt").read())
    mark_size = data["mark_size"]
    out: list[dict[str, Any]] = []
    for mode in ("default", "expandable"):
        alloc = allocator.CachingAllocator(expandable=mode == "expandable")
        live: set[int] = set()
        mark = -1
        for code, ident, size in data["events"]:
            is_mark = code == 0 and mark_size <= size < mark_size + 512 * 64 and (size - mark_size) % 512 == 0
            if is_mark:
                if mark >= 0:
                    _emulated(out, mark, mode, alloc)
                mark = (size - mark_size) // 512
                alloc.empty_cache()
                alloc.reset_peak()  # the child reset its peaks before the marker, which counts
            if code == 0:
                live.add(ident)
                alloc.malloc(ident, size)
            elif code == 1 and ident in live:
                live.discard(ident)
                alloc.free(ident)
        if mark >= 0:
            _emulated(out, mark, mode, alloc)
    return out


def _emulated(out: list[dict[str, Any]], mark: int, mode: str, alloc: Any) -> None:
    row = next((r for r in out if r["mark"] == mark), None)
    if row is None:
        row = {"mark": mark}
        out.append(row)
    row[f"emulated_reserved_{mode}"] = alloc.peak_reserved
    row["emulated_allocated"] = alloc.peak_allocated


def run_child(section: str, args: argparse.Namespace, work: Path, env_extra: dict[str, str], **flags) -> list:
    rows_path = work / f"{section}-{flags.get('expandable', 0)}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        section,
        "--work",
        str(work),
        "--rows",
        str(rows_path),
        "--steps",
        str(args.steps),
        "--deadline",
        str(args.deadline),
        "--model-dir",
        str(work / "model"),
    ]
    if args.smoke:
        cmd.append("--smoke")
    if flags.get("expandable"):
        cmd.append("--expandable")
    if flags.get("trace"):
        cmd.append("--trace")
    env = dict(os.environ, **env_extra)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None) if not env_extra.get("PYTORCH_CUDA_ALLOC_CONF") else None
    left = max(10.0, args.deadline - time.time() + 20)
    try:
        subprocess.run(cmd, env=env, timeout=left, check=False)
    except subprocess.TimeoutExpired:
        print(f"{section}: child timed out", flush=True)
    if rows_path.exists():
        return json.loads(rows_path.read_text())
    return []


def parent(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        print("no CUDA device: this check needs one; nothing was measured and nothing written")
        return 0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    args.deadline = time.time() + args.budget
    head = {"torch": torch.__version__}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        head.update(device=props.name, total_memory=props.total_memory)
    try:
        import transformers

        head["transformers"] = transformers.__version__
        import peft

        head["peft"] = peft.__version__
        import bitsandbytes

        head["bitsandbytes"] = bitsandbytes.__version__
    except Exception as exc:  # noqa: BLE001
        head["import_error"] = str(exc)
    print(json.dumps(head), flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tunebot-mech-") as tmp:
        work = Path(tmp)
        sections = args.sections.split(",")
        if "alloc" in sections:
            rows += run_child("alloc", args, work, {}, expandable=False, trace=True)
            rows += run_child(
                "alloc", args, work, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, expandable=True
            )
        if "optim" in sections:
            rows += run_child("optim", args, work, {})
        if "qlora" in sections and torch.cuda.is_available():
            from transformers import AutoConfig, AutoModelForCausalLM

            cfg = _config(args.smoke)
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.bfloat16)
            model.save_pretrained(str(work / "model"))
            del model
            rows += run_child("qlora", args, work, {})
        trace_path = work / "alloc_trace.json.gz"
        replayed: list[dict[str, Any]] = []
        if trace_path.exists():
            (out_dir / "alloc_trace.json.gz").write_bytes(trace_path.read_bytes())
            try:
                replayed = replay_trace(trace_path)
            except Exception as exc:  # noqa: BLE001 - the measurements still count
                print(f"emulator replay failed: {exc}", flush=True)
    for row in rows:
        if "request" in row:
            row["planner"] = planned(row["request"], args.smoke)
    by_mark = {r["mark"]: r for r in replayed}
    for row in rows:
        if row.get("section") == "alloc" and not row.get("expandable") and row.get("mark") in by_mark:
            row["emulator"] = by_mark[row["mark"]]
    report(rows)
    (out_dir / "mechanisms.json").write_text(json.dumps({"environment": head, "rows": rows}, indent=1))
    print(f"wrote {out_dir / 'mechanisms.json'}", flush=True)
    return 0


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value / GB:7.2f}"


def report(rows: list[dict[str, Any]]) -> None:
    print("\nalloc: LoRA r=16 on Llama-3.2-1B, micro-batch 2, plain loss (GB; planner: torch-reserved)")
    print(
        f"{'len':>5s} {'shape':9s} {'expand':6s} {'allocated':>9s} {'reserved':>9s} {'res/alloc':>9s} "
        f"{'outside':>7s} {'planner':>7s} {'meas/plan':>9s} {'emul.res':>8s} {'emul.exp':>8s}"
    )
    for r in rows:
        if r.get("section") != "alloc":
            continue
        plan = (r.get("planner") or {}).get("torch_reserved")
        emu = r.get("emulator") or {}
        ratio = r["peak_reserved"] / plan if plan else math.nan
        print(
            f"{r['max_len']:5d} {r['shape']:9s} {'yes' if r['expandable'] else 'no':6s} "
            f"{_gb(r['peak_allocated'])}"
            f"   {_gb(r['peak_reserved'])}   {r['peak_reserved'] / max(1, r['peak_allocated']):7.3f} "
            f"{_gb(r['outside_torch'])} {_gb(plan)} {ratio:9.3f} {_gb(emu.get('emulated_reserved_default'))}"
            f" {_gb(emu.get('emulated_reserved_expandable'))}"
        )
    print(
        "\noptim: full fine-tune, AdamW implementations (GB; growth = allocated growth in optimizer.step())"
    )
    print(
        f"{'precision':9s} {'impl':8s} {'growth':>7s} {'B/param':>7s} {'allocated':>9s} {'reserved':>9s} "
        f"{'planner':>7s} {'meas/plan':>9s}"
    )
    for r in rows:
        if r.get("section") != "optim":
            continue
        plan = (r.get("planner") or {}).get("torch_reserved")
        ratio = r["peak_reserved"] / plan if plan else math.nan
        print(
            f"{r['precision']:9s} {r['optimizer_impl']:8s} {_gb(r['step_growth'])} "
            f"{r['step_growth_per_param']:7.2f} "
            f"{_gb(r['peak_allocated'])}   {_gb(r['peak_reserved'])} {_gb(plan)} {ratio:9.3f}"
        )
    print("\nqlora / dequant (GB)")
    for r in rows:
        if r.get("section") == "dequant":
            print(
                f"Linear4bit 8192x28672 storage {r['quant_storage']:8s}: forward +{r['forward_per_param']} "
                f"B/param, backward +{r['backward_per_param']} B/param"
            )
        if r.get("section") == "qlora":
            plan = (r.get("planner") or {}).get("torch_reserved")
            print(
                f"QLoRA 1B seq 4096 loss {r['loss']:8s}: allocated {_gb(r['peak_allocated'])} reserved "
                f"{_gb(r['peak_reserved'])} outside {_gb(r['outside_torch'])} planner {_gb(plan)}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "mechanisms_out"))
    ap.add_argument("--sections", default="alloc,optim,qlora")
    ap.add_argument("--steps", type=int, default=12, help="variable-length micro-steps per configuration")
    ap.add_argument("--budget", type=float, default=210.0, help="seconds before sections are skipped")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (tests)")
    ap.add_argument("--child", choices=list(CHILDREN))
    ap.add_argument("--work")
    ap.add_argument("--rows")
    ap.add_argument("--deadline", type=float, default=0.0)
    ap.add_argument("--model-dir")
    ap.add_argument("--expandable", action="store_true")
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    if args.child:
        out: list[dict[str, Any]] = []
        try:
            CHILDREN[args.child](args, out)
        finally:
            Path(args.rows).write_text(json.dumps(out))
        return 0
    return parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
