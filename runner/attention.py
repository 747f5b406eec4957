"""Packed rows without a mask: each example attends only to itself through a variable-length kernel.

The runner packs several examples into one row (runner/contract/packing.py). What kept them apart was a
[b, 1, s, s] block-causal mask built on the host for every micro-batch (7 ms at 1,024 tokens, up to 80 ms at
4,096), copied from pageable memory, which took SDPA off its flash kernel and off causal skipping. Now a batch
carries where its examples start instead (runner/data/batching.py ``model_inputs``: ``cu_seq_lens_q/k`` over
the flattened rows and their longest ``max_length_q/k``, FlashAttention's own keyword names, which
transformers passes from the model's call to every attention layer) and, on CUDA with a 16-bit compute dtype,
the model runs ``tunebot_varlen``: this module's attention function, registered with transformers'
AttentionInterface (and on purpose not with its mask interface: transformers then builds no mask at all).

It calls the first of these that this host has and that passes ``probe`` on the device before the first step
(a few packed segments of the model's head shape, forward and backward, against causal SDPA per segment: none
of these kernels has run on a GPU of this project's yet, so one that raises or computes something else is
passed over with its reason in the job's log, never the run's first step failing):

- flash-attn's ``flash_attn_varlen_func`` (the flash-attn package, where a wheel matches the image's torch and
  CUDA): what TRL's padding-free collator uses;
- torch's own ``torch.nn.attention.varlen.varlen_attn`` (recent torch): the same FlashAttention kernels inside
  torch, called as the signature of the torch present takes it (``adapt_varlen_attn``);
- ``torch.ops.aten._flash_attention_forward``, the kernel ``varlen_attn`` wraps, in CUDA builds of older torch
  (the stock image's 2.8);
- else no varlen kernel: transformers' SDPA with the block mask it derives from the position ids on the device
  (the memory-efficient kernel, no causal skipping). ``per_segment`` (a loop over the examples) is what this
  function runs off CUDA: the CPU tests run it.

Without ``cu_seq_lens_q`` (generation with its KV cache, a plain call) it is transformers' own SDPA function.
On the CPU the runner keeps transformers' SDPA: packed rows there get the block mask transformers derives from
the position ids (restarting at 0 for each example) on the device, which on a CPU is the host; no mask is
carried by the batch anywhere.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

NAME = "tunebot_varlen"

# kernel(q, k, v, cu, max_len, scale) on [t, h, d] tensors (k, v may have fewer heads), causal within segments
KernelFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


@dataclass(frozen=True)
class Kernel:
    name: str  # as the job's log says it
    call: KernelFn


@dataclass
class Choice:
    """What packed rows attend through on this host (``resolve``): a kernel, and why the ones before it were
    passed over."""

    kernel: Kernel | None = None
    passed_over: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The job log's line."""
        skipped = f" (not {'; not '.join(self.passed_over)})" if self.passed_over else ""
        if self.kernel is not None:
            return f"attention: packed rows through {self.kernel.name}, no mask{skipped}"
        return f"attention: transformers' sdpa with the packed rows' mask made on the device{skipped}"


_CHOICE: list[Choice] = []  # resolved once per process: the kernel every layer's call uses


def _flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, n: int, scale: float):
    from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]

    return flash_attn_varlen_func(q, k, v, cu, cu, n, n, softmax_scale=scale, causal=True)


def adapt_varlen_attn(fn: Callable[..., Any]) -> KernelFn | None:
    """torch's ``varlen_attn`` called as its signature on this host takes it: causal as
    ``window_size=(-1, 0)`` (newer) or ``is_causal=True`` (its first releases); ``scale`` and ``enable_gqa``
    where it has them, else the queries scaled and grouped-query K/V repeated here. None when it cannot be
    made causal."""
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        causal: dict[str, Any] = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, n: int, scale: float):
        kwargs = dict(causal)
        if "scale" in params:
            kwargs["scale"] = scale
        else:  # its default is 1/sqrt(d): fold the difference into the queries
            q = q * (scale * q.shape[-1] ** 0.5)
        if q.shape[1] != k.shape[1]:
            if "enable_gqa" in params:
                kwargs["enable_gqa"] = True
            else:
                group = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return fn(q, k, v, cu, cu, n, n, **kwargs)

    return call


def _aten_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, n: int, scale: float):
    """torch's own FlashAttention-2 kernel, variable-length form (in every CUDA build since torch 2.2, the one
    ``varlen_attn`` wraps): what a stock image's torch without ``torch.nn.attention.varlen`` still has."""
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, n, n, 0.0, True, False, scale=scale)
    return out[0]


def candidates() -> list[Kernel | str]:
    """This host's varlen kernels in order of preference, or why one is absent (a line for the log)."""
    found: list[Kernel | str] = []
    if importlib.util.find_spec("flash_attn") is not None:
        found.append(Kernel("flash-attn's flash_attn_varlen_func", _flash_attn))
    else:
        found.append("flash-attn (not installed)")
    if importlib.util.find_spec("torch.nn.attention.varlen") is not None:
        from torch.nn.attention.varlen import varlen_attn

        adapted = adapt_varlen_attn(varlen_attn)
        if adapted is not None:
            found.append(Kernel("torch's varlen_attn (FlashAttention)", adapted))
        else:
            found.append("torch's varlen_attn (no causal form in this torch)")
    if hasattr(torch.ops.aten, "_flash_attention_forward"):
        found.append(Kernel("torch's FlashAttention kernel (aten._flash_attention_forward)", _aten_flash))
    return found


def probe(
    kernel: KernelFn, device: torch.device | str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int
) -> str | None:
    """Why ``kernel`` cannot train here (it raised, or its output or gradients differ from causal SDPA run per
    segment), None when it can: a few packed segments of the model's own head shape, forward and backward,
    on the device, before the first step (runner/kernel_check.py) - a kernel no GPU of this project's has
    run fails here, not there."""
    from runner.kernel_check import compare

    lengths = [5, 11, 8]
    longest = max(lengths)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    scale = head_dim**-0.5

    def inputs_on(on_device: Any, on: torch.dtype) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        qkv = [torch.randn(starts[-1], h, head_dim, generator=gen) for h in (heads, kv_heads, kv_heads)]
        cu = torch.tensor(starts, dtype=torch.int32)
        return [t.to(device=on_device, dtype=on) for t in qkv] + [cu.to(on_device)]

    found = compare(
        lambda q, k, v, cu: kernel(q, k, v, cu, longest, scale),
        lambda q, k, v, cu: per_segment(q, k, v, starts, scale),
        inputs_on,
        (0, 1, 2),
        device,
        dtype,
        rtol=0.03,  # bf16 carries 8 bits of mantissa
        atol=1e-3,
    )
    if found is None:
        return None
    name = ("output", "dq", "dk", "dv")[found.index] if found.index >= 0 else ""
    if found.what == "raised":
        return found.error
    if found.what == "missing":
        return f"no gradient reaches its {name[1:]}"
    if found.what == "shape":
        return f"its {name} is not causal attention's (shape {found.shape})"
    return f"its {name} differs from causal attention's"


def resolve(
    device: torch.device,
    dtype: torch.dtype,
    config: Any,
    found: list[Kernel | str] | None = None,
) -> Choice:
    """The first of this host's varlen kernels (``candidates``) that trains correctly on ``device`` in
    ``dtype`` with the model's head shape (``probe``), kept for every attention call of this process."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    choice = Choice()
    for entry in candidates() if found is None else found:
        if isinstance(entry, str):
            choice.passed_over.append(entry)
            continue
        problem = probe(entry.call, device, dtype, heads, kv_heads, head_dim)
        if problem is None:
            choice.kernel = entry
            break
        choice.passed_over.append(f"{entry.name}: {problem}")
    _CHOICE[:] = [choice]
    return choice


def chosen() -> Choice | None:
    """What ``resolve`` chose in this process, None when nothing was resolved (the CPU)."""
    return _CHOICE[0] if _CHOICE else None


def per_segment(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: list[int], scale: float | None
) -> torch.Tensor:
    """Causal SDPA over each segment of the flattened rows ([t, h, d]); ``starts``: the segments' bounds."""
    out = torch.empty_like(q)
    gqa = q.shape[1] != k.shape[1]
    for begin, end in zip(starts[:-1], starts[1:], strict=True):
        if end <= begin:
            continue
        part = F.scaled_dot_product_attention(
            q[begin:end].transpose(0, 1),
            k[begin:end].transpose(0, 1),
            v[begin:end].transpose(0, 1),
            is_causal=True,
            scale=scale,
            enable_gqa=gqa,
        )
        out[begin:end] = part.transpose(0, 1)
    return out


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: [b, h, s, d] in, [b, s, h, d] out."""
    cu = kwargs.get("cu_seq_lens_q")
    if kwargs.get("sliding_window") or kwargs.get("softcap"):  # plain_causal keeps such models off this path
        raise ValueError("tunebot_varlen computes plain causal attention: no sliding window, no soft-capping")
    if cu is None or attention_mask is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    b, h, s, d = query.shape
    if torch.is_autocast_enabled(query.device.type):  # SDPA's own autocast rule: 16-bit in
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    q, k, v = (t.transpose(1, 2).reshape(b * s, t.shape[1], d) for t in (query, key, value))
    choice = chosen()
    sixteen = q.dtype in (torch.float16, torch.bfloat16)
    kernel = choice.kernel.call if choice and choice.kernel and q.is_cuda and sixteen else None
    scale = scaling if scaling is not None else d**-0.5
    if kernel is not None:
        out = kernel(q, k, v, cu, int(kwargs["max_length_q"]), scale)
    else:  # the bounds are needed on the host: a CPU tensor already, or one sync (a rare path on a GPU)
        out = per_segment(q, k, v, [int(x) for x in cu.tolist()], scale)
    return out.reshape(b, s, h, d), None


def plain_causal(config: Any) -> bool:
    """Whether a model's attention is what the varlen kernels compute: causal over the whole segment, nothing
    else (no sliding window - Mistral's, Gemma's local layers - and no soft-capped logits - Gemma 2's). Those
    keep transformers' own attention with its mask."""
    if config is None:
        return False
    if getattr(config, "attn_logit_softcapping", None):
        return False
    layers = getattr(config, "layer_types", None) or []
    if any("sliding" in str(kind) for kind in layers):
        return False
    window = getattr(config, "sliding_window", None)
    return not (window and getattr(config, "use_sliding_window", True))


def register() -> str:
    """Register ``varlen_attention`` with transformers under NAME (once; idempotent) and return NAME."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention)
    return NAME
