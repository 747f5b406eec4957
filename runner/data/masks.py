"""Attention masks for packed rows: block-diagonal and causal, so packed examples never see each other.

transformers (5.x) passes a 4D mask of shape [batch, 1, query, key] straight to the attention kernel
(masking_utils._preprocess_mask_arguments returns it as is). Eager attention adds it to the scores and
SDPA accepts it as ``attn_mask``, so the mask is additive floats: 0 where attention is allowed and the
dtype's most negative value where it is not. It must be in the model's compute dtype for SDPA; use
``cast_mask`` when the model is not float32. With SDPA a boolean mask (True = may attend) also works and
is smaller: pass ``mask_dtype=torch.bool`` (never with eager, which adds the mask to the scores).
"""

from __future__ import annotations

import torch


def segment_ids(lengths: list[int], total: int) -> torch.Tensor:
    """Per-position segment number; positions after the examples (padding) form one last segment."""
    ids = torch.full((total,), len(lengths), dtype=torch.long)
    start = 0
    for number, length in enumerate(lengths):
        ids[start : start + length] = number
        start += length
    return ids


def block_causal_mask(segments: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[batch, 1, seq, seq] additive mask from [batch, seq] segment ids: same segment, not in the future."""
    seq = segments.shape[-1]
    same = segments[:, :, None] == segments[:, None, :]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    allowed = (same & causal)[:, None, :, :]
    if dtype == torch.bool:  # SDPA only (True = may attend): a quarter of the float32 mask's memory
        return allowed
    mask = torch.zeros(allowed.shape, dtype=dtype)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def cast_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Re-express an additive float mask in another float dtype (keeping 'blocked' at that dtype's min)."""
    if mask.dtype == dtype or not mask.is_floating_point():
        return mask
    blocked = mask < 0
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(blocked, torch.finfo(dtype).min)
