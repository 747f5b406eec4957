"""Trace a fine-tuning recipe's GPU allocations without a GPU, and replay them through the planner's
caching-allocator emulation (bot/planner/allocator.py).

Every tensor lives on the meta device: shapes, dtypes and lifetimes are real, no memory is touched. A
TorchDispatchMode sees each op's outputs (including the ops a tensor subclass such as torchao's NF4Tensor
runs inside its own dispatch); a new storage is an allocation, and a finalizer on the storage (PyTorch
keeps a storage's Python object alive as long as the storage) is its free. Flash attention, which the meta
device cannot pick, is replaced by an autograd function that allocates what the CUDA kernel does (output
and log-sum-exp; dq, dk, dv in backward).

Modes (run bench/allocator_replay/setup.sh first; it installs torchtune 0.1.1 + torchao 0.1 beside the
project's torch):
  recipe   torchtune 0.1.1's lora_finetune_single_device on Llama-2-7B for the five published rows of
           its LoRA and QLoRA tutorials: traced peak reserved vs published vs the planner's estimate.
  profile  the allocation sequence of quantizing one Linear to NF4 with torchao 0.1, checked against the
           copy bot/planner/load_phase.py replays.
  hf       Hugging Face transformers + PEFT (the project's own install, no setup.sh): full-size models,
           fixed-length batches, a whole step (forward, loss, backward, AdamW): traced peak allocated and
           reserved next to the planner's estimate for the same request.
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
import time
import weakref
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from bot.planner.allocator import CachingAllocator  # noqa: E402

ROWS = {  # torchtune tutorials, Llama-2-7B, batch 2, alpaca_cleaned, peak reserved GB (docs/estimation.md)
    "lora q,v r=8": (["q_proj", "v_proj"], False, 8, False, 64, 15.57),
    "lora all r=8": (["q_proj", "k_proj", "v_proj", "output_proj"], True, 8, False, 64, 15.87),
    "lora q,v r=64": (["q_proj", "v_proj"], False, 64, False, 64, 15.86),
    "lora all r=64": (["q_proj", "k_proj", "v_proj", "output_proj"], True, 64, False, 64, 17.04),
    "qlora all r=8": (["q_proj", "k_proj", "v_proj", "output_proj"], True, 8, True, 16, 9.29),
}


def _use_torchtune_01() -> None:
    """Put setup.sh's torchtune 0.1.1 + torchao 0.1 first on the path (only the modes that trace them)."""
    for path in (str(HERE / ".deps" / "_stubs"), str(HERE / ".deps")):
        if path not in sys.path:
            sys.path.insert(0, path)


class Recorder(CachingAllocator):
    """The allocator emulation, also keeping the event list (for `profile`)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple] = []

    def malloc(self, handle: object, nbytes: int) -> None:
        super().malloc(handle, nbytes)
        self.events.append(("+", handle, nbytes))

    def free(self, handle: object) -> None:
        super().free(handle)
        self.events.append(("-", handle))


class AllocationTracer(TorchDispatchMode):
    def __init__(self, alloc: CachingAllocator) -> None:
        super().__init__()
        self.alloc = alloc
        self.live: dict[int, tuple[int, int]] = {}
        self.count = 0

    def _freed(self, handle: tuple[int, int]) -> None:
        if self.live.get(handle[0]) == handle:
            del self.live[handle[0]]
            self.alloc.free(handle)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = tree_flatten((args, kwargs))[0]
        sub = [t for t in flat if isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, nn.Parameter)]
        if sub:
            with self:  # what the subclass allocates inside its own dispatch counts too
                out = type(sub[0]).__torch_dispatch__(func, types, args, kwargs)
        else:
            out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if type(t) not in (torch.Tensor, nn.Parameter) or t.device.type != "meta":
                continue
            storage = t.untyped_storage()
            if storage._cdata in self.live or storage.nbytes() == 0:
                continue
            self.count += 1
            handle = (storage._cdata, self.count)
            self.live[storage._cdata] = handle
            self.alloc.malloc(handle, storage.nbytes())
            weakref.finalize(storage, self._freed, handle)
        return out


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        delta = q.new_empty(q.shape[:-1], dtype=torch.float32)  # noqa: F841 (rowsum(dO * O), alive in the kernel)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _patch_sdpa() -> None:
    _use_torchtune_01()
    import torchtune.modules.attention as attention

    class Functional:
        def __getattr__(self, name):
            return getattr(nn.functional, name)

        @staticmethod
        def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
            return FlashAttention.apply(q, k, v)

    class NN:
        functional = Functional()

        def __getattr__(self, name):
            return getattr(nn, name)

    attention.nn = NN()


def alpaca_lengths(seed: int, n: int, max_len: int = 512, median: int = 180, rows: int = 2) -> list[int]:
    """Padded batch lengths: the longest of `rows` alpaca_cleaned-like samples (Llama-2 tokens, median ~180,
    long tail), truncated at torchtune 0.1.1's alpaca max_seq_len of 512; the batch is padded to it."""
    rnd = random.Random(seed)
    mu = math.log(median)
    return [min(max_len, max(int(rnd.lognormvariate(mu, 0.6)) for _ in range(rows))) for _ in range(n)]


def trace_recipe(name: str, steps: int, seed: int) -> tuple[float, float, float, float]:
    """(reserved after model init, peak reserved after `steps` micro-steps, peak allocated, the least
    memory the whole sequence runs in) in GB."""
    from bot.planner.allocator import smallest_capacity

    _use_torchtune_01()
    from torchtune import modules, utils
    from torchtune.models.llama2 import lora_llama2_7b, qlora_llama2_7b
    from torchtune.modules.peft.peft_utils import get_adapter_params, set_trainable_params

    attn_modules, mlp, rank, quantize, accum, _ = ROWS[name]
    builder = qlora_llama2_7b if quantize else lora_llama2_7b
    alloc = Recorder()
    tracer = AllocationTracer(alloc)
    with tracer, utils.set_default_dtype(torch.bfloat16), torch.device("meta"):  # the recipe's _setup_model
        model = builder(
            lora_attn_modules=attn_modules,
            apply_lora_to_mlp=mlp,
            apply_lora_to_output=False,
            lora_rank=rank,
            lora_alpha=2 * rank,
        )
    host = {
        k: torch.empty(p.shape, dtype=torch.bfloat16) for k, p in model.named_parameters() if "lora" not in k
    }
    with tracer:
        set_trainable_params(model, get_adapter_params(model))
        utils.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerDecoderLayer})
        with torch.no_grad():  # load_state_dict: param.copy_(host tensor) (NF4: re-quantized on the GPU)
            for key, p in model.named_parameters():
                if key in host:
                    p.copy_(host[key])
    del host
    init = alloc.reserved
    with tracer:
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=3e-4, weight_decay=0.01
        )
        loss_fn = nn.CrossEntropyLoss()
        for i, n in enumerate(alpaca_lengths(seed, steps)):
            tokens = torch.zeros(2, n, dtype=torch.long, device="meta")
            labels = torch.zeros(2, n, dtype=torch.long, device="meta")
            logits = model(tokens)  # the recipe's train loop (loss.item() for logging aside)
            logits = logits[..., :-1, :].contiguous().transpose(1, 2)
            loss = loss_fn(logits, labels[..., 1:].contiguous()) / accum
            loss.backward()
            del logits, loss, tokens, labels
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    needed = smallest_capacity(alloc.events)
    return init / 1e9, alloc.peak_reserved / 1e9, alloc.peak_allocated / 1e9, needed / 1e9


HF_CASES = [  # (label, planner request); the trace builds the same model and step
    (
        "Llama-3.2-3B LoRA q,v r=32, 4 x 768, no ckpt",
        dict(
            model="meta-llama/Llama-3.2-3B",
            method="lora",
            lora_r=32,
            lora_targets=["q", "v"],
            batch_size=4,
            seq_len=768,
            gradient_checkpointing=False,
        ),
    ),
    (
        "Llama-3.2-3B full bf16, 4 x 768, no ckpt",
        dict(
            model="meta-llama/Llama-3.2-3B",
            method="full",
            precision="bf16",  # traced as pure bf16 weights (tunebot's own default for full is mixed)
            batch_size=4,
            seq_len=768,
            gradient_checkpointing=False,
        ),
    ),
    (
        "Llama-3.1-8B LoRA all r=16, 1 x 2048, ckpt",
        dict(
            model="meta-llama/Llama-3.1-8B",
            method="lora",
            lora_r=16,
            batch_size=1,
            seq_len=2048,
            gradient_checkpointing=True,
        ),
    ),
    (
        "Qwen2.5-7B LoRA all r=16, 2 x 1024, ckpt",
        dict(
            model="Qwen/Qwen2.5-7B",
            method="lora",
            lora_r=16,
            batch_size=2,
            seq_len=1024,
            gradient_checkpointing=True,
        ),
    ),
    (
        "Llama-3.1-8B LoRA all r=16, 1 x 16384, ckpt",
        dict(
            model="meta-llama/Llama-3.1-8B",
            method="lora",
            lora_r=16,
            batch_size=1,
            seq_len=16384,
            gradient_checkpointing=True,
        ),
    ),
    (
        "Llama-3.2-1B full bf16, 2 x 1024, ckpt",
        dict(
            model="meta-llama/Llama-3.2-1B",
            method="full",
            precision="bf16",  # traced as pure bf16 weights (tunebot's own default for full is mixed)
            batch_size=2,
            seq_len=1024,
            gradient_checkpointing=True,
        ),
    ),
    (
        "Qwen3-4B LoRA q,v r=8, 2 x 512, no ckpt",
        dict(
            model="Qwen/Qwen3-4B",
            method="lora",
            lora_r=8,
            lora_targets=["q", "v"],
            batch_size=2,
            seq_len=512,
            gradient_checkpointing=False,
        ),
    ),
]
HF_CASES += [  # the runner's chunked loss (runner/loss.py): what the planner prices for tunebot's own jobs
    (
        "Llama-3.1-8B LoRA all r=16, 1 x 16384, ckpt, chunked",
        dict(
            model="meta-llama/Llama-3.1-8B",
            method="lora",
            lora_r=16,
            batch_size=1,
            seq_len=16384,
            gradient_checkpointing=True,
            loss="chunked",
        ),
    ),
    (
        "Llama-3.2-1B full bf16, 2 x 1024, ckpt, chunked",
        dict(
            model="meta-llama/Llama-3.2-1B",
            method="full",
            precision="bf16",
            batch_size=2,
            seq_len=1024,
            gradient_checkpointing=True,
            loss="chunked",
        ),
    ),
]
for _, _request in HF_CASES:
    _request.setdefault("loss", "plain")  # transformers' own loss (the model's logits, ForCausalLMLoss)


def _sdpa_like_cuda(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if enable_gqa and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    return FlashAttention.apply(q, k, v)


def trace_hf(request: dict, steps: int = 2, lengths: list[int] | None = None) -> Recorder:
    """The allocator (with its event list) after `steps` fixed-length steps of the request in plain HF,
    or one step per entry of `lengths` (batches padded to those lengths)."""
    import transformers.masking_utils as masking
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from bot.planner.models import resolve

    saved = nn.functional.scaled_dot_product_attention, masking.find_packed_sequence_indices
    nn.functional.scaled_dot_product_attention = _sdpa_like_cuda  # the meta device cannot pick flash
    masking.find_packed_sequence_indices = lambda position_ids: None  # reads values; rows are not packed
    try:
        arch, _ = resolve(request["model"])
        config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if k != "architectures"})
        roles = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
        targets = request.get("lora_targets", "all-linear")
        alloc = Recorder()
        tracer = AllocationTracer(alloc)
        with tracer, torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
            if request["method"] == "lora":
                modules = "all-linear" if targets == "all-linear" else [roles[t] for t in targets]
                lora = LoraConfig(
                    r=request["lora_r"], lora_alpha=2 * request["lora_r"], target_modules=modules
                )
                model = get_peft_model(model, lora)
            if request["gradient_checkpointing"]:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                if request["method"] == "lora":
                    model.enable_input_require_grads()
            model.train()
            # foreach: torch's own default on CUDA (on the meta device it would pick the for-loop, and fused
            # needs CUDA); the planner is asked about the same optimizer
            optimizer = torch.optim.AdamW(
                [p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=False, foreach=True
            )
            head = None
            if request.get("loss", "plain") != "plain":  # the runner's own loss (runner/loss.py)
                from runner.loss import HeadLoss

                head = HeadLoss(model, request["loss"], model.config)  # logits for every position
            for length in lengths or [request["seq_len"]] * steps:
                ids = torch.zeros(request["batch_size"], length, dtype=torch.long, device="meta")
                if head is not None:
                    loss = head(model, {"input_ids": ids}, ids)
                else:
                    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                del loss
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    finally:
        nn.functional.scaled_dot_product_attention, masking.find_packed_sequence_indices = saved
    return alloc


def hf_report(variable_steps: int) -> int:
    from bot.planner.allocator import smallest_capacity
    from bot.planner.memory import estimate_memory
    from bot.planner.models import resolve
    from bot.planner.request import EstimateRequest

    def planned(request: dict, **changes) -> float:
        # no autocast on the meta device (fp32 adapters see fp32 inputs); the trace's AdamW is foreach
        req = EstimateRequest(
            **dict(request, **changes), autocast=False, optimizer_impl="foreach", expandable_segments=False
        )
        m = estimate_memory(resolve(req.model)[0], req)
        return m.torch_reserved_gb

    print("Fixed-length batches (GB, no CUDA context): reserved on a roomy card, what they need")
    print(f"{'case':44s} {'roomy':>7s} {'needed':>7s} {'planner':>8s} {'vs needed':>9s}  (peak allocated)")
    for label, request in HF_CASES:
        t0 = time.time()
        alloc = trace_hf(request)
        reserved, allocated = alloc.peak_reserved / 1e9, alloc.peak_allocated / 1e9
        needed = smallest_capacity(alloc.events) / 1e9
        plan = planned(request)
        print(
            f"{label:44s} {reserved:7.2f} {needed:7.2f} {plan:8.2f} {plan / needed - 1:+9.1%}  "
            f"({allocated:.2f}; {time.time() - t0:.0f} s)",
            flush=True,
        )
    print(
        f"\nVariable-length batches ({variable_steps} steps, each padded to its longest row; lengths "
        "log-normal, median 250): reserved on a roomy card, and the least memory the same steps run in"
    )
    print(f"{'case':44s} {'roomy':>7s} {'needed':>7s} {'planner':>8s} {'vs needed':>9s}")
    for label, request in HF_CASES:
        if request["batch_size"] < 2:
            continue
        t0 = time.time()
        lengths = alpaca_lengths(
            1, variable_steps, request["seq_len"], median=250, rows=request["batch_size"]
        )
        alloc = trace_hf(request, lengths=lengths)
        needed = smallest_capacity(alloc.events) / 1e9
        plan = planned(request, seq_len=max(lengths), packing=False)
        print(
            f"{label:44s} {alloc.peak_reserved / 1e9:7.2f} {needed:7.2f} {plan:8.2f} "
            f"{plan / needed - 1:+9.1%}  ({time.time() - t0:.0f} s)",
            flush=True,
        )
    return 0


def planner_estimate(name: str) -> float:
    from bot.planner.memory import estimate_memory
    from bot.planner.models import resolve
    from bot.planner.request import EstimateRequest

    sys.path.insert(0, str(HERE.parents[1] / "tests" / "planner"))
    from published import ROWS as PUBLISHED  # noqa: PLC0415

    row_id = {
        "lora q,v r=8": "torchtune 2-7B lora qv r8",
        "lora all r=8": "torchtune 2-7B lora all r8",
        "lora q,v r=64": "torchtune 2-7B lora qv r64",
        "lora all r=64": "torchtune 2-7B lora all r64",
        "qlora all r=8": "torchtune 2-7B qlora",
    }[name]
    row = next(r for r in PUBLISHED if r.id == row_id)
    req = EstimateRequest(**row.request)
    m = estimate_memory(resolve(req.model)[0], req)
    return m.torch_reserved_gb


def _chunked_convert(inpt_tensor, n_blocks, block_size, nf4):
    """torchao >= 0.2's NF4Tensor.convert_to_norm_float_weight (BSD-3, PyTorch): quantizes in chunks of
    2**20 elements instead of building the (numel, 16) distance tensor at once."""
    from torchao.dtypes.nf4tensor import NF4Tensor, get_block_absmax

    flattened_tensor = inpt_tensor.flatten()
    numel = inpt_tensor.numel()
    blocks = flattened_tensor.view(n_blocks, block_size)
    scalers = get_block_absmax(inpt_tensor.flatten(), block_size)
    scales = scalers.unsqueeze(-1).expand(n_blocks, block_size)
    scaled_blocks = blocks / scales
    quantized_blocks = torch.empty(numel, dtype=torch.uint8, device=inpt_tensor.device)
    flattened = scaled_blocks.flatten()
    for chunk in range(math.ceil(numel / 1024**2)):
        start, end = chunk * 1024**2, min((chunk + 1) * 1024**2, numel)
        quantized_blocks[start:end] = NF4Tensor.quantize_tensor_nearest(flattened[start:end], nf4).to(
            torch.uint8
        )
    combined_blocks = quantized_blocks[::2] << 4 | quantized_blocks[1::2]
    return combined_blocks.to(torch.uint8)


def record_profile(kind: str) -> dict[str, list[tuple]]:
    """Events of building a Linear on the GPU and quantizing it, then of loading a 16-bit weight into it,
    as (op, id, bytes per parameter, constant bytes) fitted over two Linear sizes."""
    _use_torchtune_01()
    from torchao.dtypes.nf4tensor import NF4Tensor
    from torchtune import utils
    from torchtune.modules.peft.lora import LoRALinear

    if kind == "torchao":
        NF4Tensor.convert_to_norm_float_weight = staticmethod(_chunked_convert)
    runs = []
    for d_in, d_out in ((4096, 11008), (5120, 5120)):
        phases = {}
        alloc = Recorder()
        tracer = AllocationTracer(alloc)
        with tracer, utils.set_default_dtype(torch.bfloat16), torch.device("meta"):  # as the recipe builds
            layer = LoRALinear(d_in, d_out, rank=8, alpha=16, quantize_base=True)
        phases["build"] = list(alloc.events)
        alloc.events.clear()
        with tracer:  # torchtune 0.1.x builds one block and deep-copies it per layer (NF4 clone)
            copied = copy.deepcopy(layer)
        phases["clone"] = list(alloc.events)
        alloc.events.clear()
        host = torch.empty(d_out, d_in, dtype=torch.bfloat16)
        with tracer, torch.no_grad():
            copied.weight.copy_(host)  # load_state_dict from a host checkpoint
        phases["load"] = list(alloc.events)
        runs.append((d_in * d_out, phases))
        del layer, copied
    (n1, p1), (n2, p2) = runs
    out: dict[str, list[tuple]] = {}
    for phase in ("build", "clone", "load"):
        ids: dict[object, int] = {}
        events = []
        for e1, e2 in zip(p1[phase], p2[phase], strict=True):
            assert e1[0] == e2[0]
            ident = ids.setdefault(e1[1], len(ids))
            if e1[0] == "-":
                events.append(("-", ident))
                continue
            per_param = Fraction(e1[2] - e2[2], n1 - n2)
            const = e1[2] - per_param * n1
            events.append(("+", ident, per_param, int(const)))
        out[phase] = events
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["recipe", "profile", "hf"])
    ap.add_argument("--steps", type=int, default=32, help="micro-steps per row (recipe)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", nargs="*", default=list(ROWS))
    ap.add_argument("--steps-variable", type=int, default=30, help="variable-length steps per case (hf)")
    args = ap.parse_args()
    if args.mode == "hf":
        return hf_report(args.steps_variable)
    if not (HERE / ".deps" / "torchtune").is_dir():
        print(
            "run bench/allocator_replay/setup.sh first (installs torchtune 0.1.1 + torchao 0.1)",
            file=sys.stderr,
        )
        return 2
    if args.mode == "profile":
        from bot.planner import load_phase

        recorded = record_profile("torchao-0.1")
        adapters = {"build": (27, 28), "clone": (45, 46), "load": ()}  # lora_a/lora_b: not per-parameter
        ok = True
        for phase, events in recorded.items():
            events = [e for e in events if not (e[0] == "+" and e[1] in adapters[phase])]
            planner = getattr(load_phase, f"_{phase.upper()}")
            same = events == planner
            ok &= same
            peak = float(load_phase.peak_bytes_per_param(events))
            print(
                f"torchao 0.1 {phase}: {len(events)} events, {sum(e[0] == '+' for e in events)} allocations; "
                f"peak scratch {peak:.3f} B/param; planner's copy {'matches' if same else 'DIFFERS'}"
            )
            if not same:
                print("  recorded:", [(e[0], e[1], str(e[2]), e[3]) if e[0] == "+" else e for e in events])
        return 0 if ok else 1
    _patch_sdpa()
    print(
        f"{'row':16s} {'published':>9s} {'traced':>8s} {'err':>6s} {'planner':>8s} {'err':>6s} "
        f"{'needed':>7s} {'p/need':>6s}  "
        f"(init reserved, peak allocated; GB; {args.steps} micro-steps)"
    )
    for name in args.rows:
        t0 = time.time()
        init, reserved, allocated, needed = trace_recipe(name, args.steps, args.seed)
        published = ROWS[name][-1]
        planned = planner_estimate(name)
        print(
            f"{name:16s} {published:9.2f} {reserved:8.2f} {reserved / published - 1:+6.1%} {planned:8.2f} "
            f"{planned / published - 1:+6.1%} {needed:7.2f} {planned / needed - 1:+6.1%}  "
            f"({init:.2f}, {allocated:.2f}; {time.time() - t0:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
