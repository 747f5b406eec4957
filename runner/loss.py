"""The training loss: cross-entropy over the vocabulary without the whole sequence's logits ever existing.

The plain Hugging Face path (``model(...).logits`` then ``F.cross_entropy(logits.float(), ...)``) keeps, at
the start of backward, the bf16 logits' fp32 upcast, the log-softmax output, its gradient and
log_softmax_backward's output: ~12 bytes per token and vocabulary entry, 1.5 GB per 1,000 tokens with Llama
3's 128,256 entries, and often the largest activation of a LoRA run at long sequence. ``chunked`` (the
default) computes the loss from the final hidden states a chunk of label tokens at a time, each chunk under
``torch.utils.checkpoint``: only the hidden states are kept for backward, and each chunk's logits, upcast and
log-softmax are recomputed there, one chunk at a time (CHUNK_LOGIT_ELEMENTS logits per chunk,
runner/contract/spec.py, which the planner prices). Prompt and padding positions get no logits at all. The
cost is one more lm_head matmul per label token in backward.

The loss runs inside the lm_head's own call (a forward pre-hook that computes it and hands the head an empty
slice), so every wrapper sees a normal forward: FSDP has gathered the head's weight there, peft and gradient
checkpointing are untouched, parameter names do not change. Model-specific logit transforms that transformers
applies after the head (Gemma 2's final soft-capping, Cohere's logit_scale, Granite's logits_scaling) are
applied per chunk; ``check_against_plain`` compares both paths on a short slice at start, and a model whose
head does something else trains with the plain loss (said on stdout).

``liger`` hands the same hidden states to Liger's fused linear cross-entropy kernel
(liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss, CUDA + Triton), which never materialises more
than a chunk either and computes the gradients during the forward: what a run on CUDA uses by default where
liger-kernel is installed (runner/kernels.py says in the job's log when it is not, and the run keeps the
loss the plan chose).

No host sync in the forward: the positions that carry loss come as an index worked out on the host
(runner/data/batching.py ``model_inputs``), so the hidden states are picked with ``index_select`` (a size the
host knows) instead of a boolean mask (``hidden[keep]`` asks the device how many there are and waits for
it). Without an index every position gets logits (ignored ones add zero): still no sync."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from runner.contract.spec import CHUNK_LOGIT_ELEMENTS, chunk_tokens

IGNORE_INDEX = -100


def plain_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy of the logits upcast to fp32 (transformers' ForCausalLMLoss)."""
    return F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def head_transform(config: Any) -> tuple[float, float]:
    """(multiplier, soft-cap) transformers applies to lm_head's output for this config (1.0, 0.0: none)."""
    scale = 1.0
    if getattr(config, "logit_scale", None):  # Cohere: logits * logit_scale
        scale *= float(config.logit_scale)
    if getattr(config, "logits_scaling", None):  # Granite: logits / logits_scaling
        scale /= float(config.logits_scaling)
    return scale, float(getattr(config, "final_logit_softcapping", None) or 0.0)


def _chunk_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)
    if scale != 1.0:
        logits = logits * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    scale: float = 1.0,
    softcap: float = 0.0,
    chunk: int | None = None,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Summed next-token cross-entropy of ``hidden`` ([b, s, h], the head's input) against ``labels``
    ([b, s]), computed chunk by chunk over the label positions; no more than one chunk's logits are alive at
    a time, in forward and in backward. ``index``: the flattened [b, s - 1] positions that carry loss
    (``label_positions``); None: every position."""
    picked, wanted = label_positions(hidden, labels, index)
    n = picked.shape[0]
    if n == 0:
        return hidden.sum() * 0.0  # nothing to learn here, but backward must still reach the graph
    step = chunk or chunk_tokens(weight.shape[0])
    total: torch.Tensor | None = None
    for start in range(0, n, step):
        args = (picked[start : start + step], weight, bias, wanted[start : start + step], scale, softcap)
        # Under autograd each chunk keeps only its inputs (views of `picked`) and recomputes in backward.
        part = (
            checkpoint(_chunk_loss, *args, use_reentrant=False)
            if torch.is_grad_enabled()
            else _chunk_loss(*args)
        )
        total = part if total is None else total + part
    assert total is not None
    return total


def label_positions(
    hidden: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """([n, h] hidden states, [n] targets) of the positions whose next token carries loss: ``index`` (on the
    device, sized on the host) picks them; without one, every position (ignored ones add zero). Neither path
    has a data-dependent shape, so neither waits for the device."""
    flat = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    targets = labels[:, 1:].reshape(-1)
    if index is None:
        return flat, targets
    return flat.index_select(0, index), targets.index_select(0, index)


def liger_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    scale: float = 1.0,
    softcap: float = 0.0,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same sum from Liger's fused linear cross-entropy (CUDA + Triton)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    picked, wanted = label_positions(hidden, labels, index)
    if picked.shape[0] == 0:
        return hidden.sum() * 0.0
    if scale != 1.0:
        picked = picked * scale  # (x W^T) * s == (x * s) W^T without a bias; heads with a scale have none
    fn = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum", softcap=softcap or None)
    return fn(weight, picked, wanted, bias)


def output_head(model: Any) -> torch.nn.Module:
    """The model's lm_head (through peft's and FSDP's wrappers)."""
    inner = model
    for attr in ("module", "base_model", "model"):  # FSDP/DDP .module, peft .base_model.model
        head = getattr(inner, "get_output_embeddings", None)
        if callable(head) and head() is not None:
            return head()
        inner = getattr(inner, attr, inner)
    head = inner.get_output_embeddings()
    if head is None:
        raise ValueError("the model has no output embeddings (lm_head) to compute the loss with")
    return head


class HeadLoss:
    """The loss computed inside the lm_head's call (module docstring); ``kind`` chunked | liger | plain.

    Use: ``loss = head_loss(model, inputs, labels)`` - one forward, the summed loss back."""

    def __init__(self, model: Any, kind: str, config: Any, *, chunk: int | None = None) -> None:
        self.kind = kind
        self.scale, self.softcap = head_transform(config)
        self.chunk = chunk
        self._labels: torch.Tensor | None = None
        self._index: torch.Tensor | None = None
        self._loss: torch.Tensor | None = None
        self._handle = None
        if kind != "plain":
            self._handle = output_head(model).register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self._labels is None:  # a call outside a loss computation (generation, a plain check): untouched
            return None
        hidden = args[0]
        weight, bias = module.weight, getattr(module, "bias", None)
        fn: Callable[..., torch.Tensor] = liger_loss if self.kind == "liger" else chunked_loss
        extra = {"chunk": self.chunk} if self.kind == "chunked" else {}
        self._loss = fn(
            hidden,
            weight,
            bias,
            self._labels,
            scale=self.scale,
            softcap=self.softcap,
            index=self._index,
            **extra,
        )
        return (hidden[..., :0, :],) + tuple(args[1:])  # the head's own matmul gets nothing to do

    def __call__(
        self,
        model: Any,
        inputs: dict[str, Any],
        labels: torch.Tensor,
        index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The summed loss of one forward. ``index``: the flattened positions that carry loss, worked out on
        the host (runner/data/batching.model_inputs); None: every position."""
        if self.kind == "plain":
            return plain_loss(model(**inputs, use_cache=False).logits, labels)
        self._labels, self._index = labels, index
        try:
            logits = model(**inputs, use_cache=False).logits  # empty: [b, 0, vocab]
            loss = self._loss
        finally:
            self._labels, self._index, self._loss = None, None, None
        if loss is None:
            raise RuntimeError("the model's forward never called its lm_head: cannot compute the loss there")
        # The model's output joins the graph (adding an exact zero): FSDP starts its backward bookkeeping (the
        # root's pre-backward hook, which queues the end-of-backward callback) from the output's gradient.
        return loss + logits.sum() * 0.0 if logits.requires_grad else loss

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.kind = "plain"


@torch.no_grad()
def check_against_plain(
    head_loss: HeadLoss,
    model: Any,
    batch: dict[str, torch.Tensor],
    device: torch.device | str,
    *,
    tokens: int = 64,
    rtol: float = 2e-2,
) -> str | None:
    """Both losses on the first `tokens` positions of the first row of a host ``batch``; a reason when they
    differ (then the caller falls back to the plain loss), else None."""
    from runner.data.batching import model_inputs

    if head_loss.kind == "plain":
        return None
    width = min(tokens, batch["labels"].shape[1])
    small = {k: v[:1, :width] for k, v in batch.items() if k != "attention_mask" or v.dim() == 2}
    if int((small["labels"][:, 1:] != IGNORE_INDEX).sum()) == 0:
        small["labels"] = small["input_ids"].clone()  # only the comparison: any targets will do
    inputs, y, index = model_inputs(small, device)
    plain = float(plain_loss(model(**inputs, use_cache=False).logits, y))
    mine = float(head_loss(model, inputs, y, index))
    if abs(mine - plain) > rtol * max(abs(plain), 1e-6):
        return f"the {head_loss.kind} loss ({mine:.6g}) differs from the model's own logits ({plain:.6g})"
    return None


__all__ = [
    "CHUNK_LOGIT_ELEMENTS",
    "HeadLoss",
    "check_against_plain",
    "chunked_loss",
    "label_positions",
    "plain_loss",
]
