"""Packed rows without a mask: each example attends only to itself through a variable-length kernel.

The runner packs several examples into one row (runner/contract/packing.py). What kept them apart was a
[b, 1, s, s] block-causal mask built on the host for every micro-batch (7 ms at 1,024 tokens, up to 80 ms at
4,096), copied from pageable memory, which took SDPA off its flash kernel and off causal skipping. Now a batch
carries where its examples start instead (runner/data/batching.py ``model_inputs``: ``cu_seq_lens_q/k`` over
the flattened rows and their longest ``max_length_q/k``, FlashAttention's own keyword names, which
transformers passes from the model's call to every attention layer) and, on CUDA with a 16-bit compute dtype,
the model runs ``tunebot_varlen``: this module's attention function, registered with transformers'
AttentionInterface (and on purpose not with its mask interface: transformers then builds no mask at all).

It calls, in order of preference:

- flash-attn's ``flash_attn_varlen_func`` (the flash-attn package, where a wheel matches the image's torch and
  CUDA): what TRL's padding-free collator uses;
- torch's own ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.9, CUDA: the same FlashAttention kernels
  inside torch);
- else per-segment causal SDPA (a loop over the examples: correct anywhere, the CPU tests run it).

Without ``cu_seq_lens_q`` (generation with its KV cache, a plain call) it is transformers' own SDPA function.
On the CPU the runner keeps transformers' SDPA: packed rows there get the block mask transformers derives from
the position ids (restarting at 0 for each example) on the device, which on a CPU is the host; no mask is
carried by the batch anywhere.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

NAME = "tunebot_varlen"
_KERNEL: list[Callable[..., torch.Tensor] | None] = []  # resolved once: the varlen kernel of this host


def varlen_kernel() -> Callable[..., torch.Tensor] | None:
    """The variable-length kernel this host has, as ``kernel(q, k, v, cu, max_len, scale)`` on [t, h, d]
    tensors (causal), or None (no CUDA, or neither flash-attn nor torch's varlen_attn)."""
    if _KERNEL:
        return _KERNEL[0]
    kernel: Callable[..., torch.Tensor] | None = None
    if torch.cuda.is_available():
        if importlib.util.find_spec("flash_attn") is not None:
            kernel = _flash_attn
        elif importlib.util.find_spec("torch.nn.attention.varlen") is not None:
            kernel = _torch_varlen
    _KERNEL.append(kernel)
    return kernel


def _flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, n: int, scale: float):
    from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]

    return flash_attn_varlen_func(q, k, v, cu, cu, n, n, softmax_scale=scale, causal=True)


def _torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, n: int, scale: float):
    from torch.nn.attention.varlen import varlen_attn

    gqa = q.shape[1] != k.shape[1]
    return varlen_attn(q, k, v, cu, cu, n, n, scale=scale, window_size=(-1, 0), enable_gqa=gqa)


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
    kernel = varlen_kernel() if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else None
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
