"""The runner's chunked cross-entropy (runner/loss.py) against the plain loss, on the CPU: peak memory of a
loss step (forward + backward) on a 128k-vocabulary model at 4k tokens, and the loss and every gradient
compared.

The model is a Llama with Llama 3's vocabulary (128,256 entries) and small blocks (the logits dominate
either way), in fp32, every parameter trained (so the lm_head's and embeddings' gradients are compared too),
all 4,096 positions carrying loss (the chunked loss gains more when prompts are masked). Memory is the peak
of live tensor bytes allocated during the step, counted op by op with a TorchDispatchMode (a new storage is
an allocation, its finalizer the free), as bench/allocator_replay counts them; the planner's logits term for
each loss is printed beside it. Fails (exit 1) if the loss or a gradient differs by more than 1e-5.

    .venv/bin/python bench/chunked_loss.py                 (~1 min; the plain loss needs ~10 GB of RAM)
    .venv/bin/python bench/chunked_loss.py --tokens 1024   (lighter)
"""

from __future__ import annotations

import argparse
import sys
import time
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from runner.contract.spec import chunk_tokens  # noqa: E402
from runner.loss import HeadLoss  # noqa: E402

GB = 1e9


class LiveBytes(TorchDispatchMode):
    """Peak of the bytes of storages created under this mode and still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
            if key in self.seen or nbytes == 0:
                continue
            self.seen.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out


def model(vocab: int, seed: int):  # noqa: ANN201
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16_384,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def planner_loss_gb(kind: str, vocab: int, tokens: int) -> float:
    """The planner's loss-path term for this model and these tokens (planner/memory.loss_path_bytes)."""
    from bot.planner.architectures import from_config
    from bot.planner.memory import loss_path_bytes
    from bot.planner.request import EstimateRequest

    config = model(vocab, seed=0).config.to_dict()
    arch = from_config({**config, "model_type": "llama"})
    req = EstimateRequest(model="bench", method="full", precision="fp32", seq_len=tokens, loss=kind)
    return loss_path_bytes(arch, req, tokens) / GB


def step(kind: str, vocab: int, tokens: int) -> tuple[float, float, float, dict[str, torch.Tensor]]:
    """(peak GB of the step, seconds, loss, gradients) for one loss implementation."""
    net = model(vocab, seed=0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (1, tokens), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    head = HeadLoss(net, kind, net.config)
    started = time.perf_counter()
    with LiveBytes() as meter:
        loss = head(net, inputs, ids.clone())
        loss.backward()
        value = float(loss.detach())
        del loss
    seconds = time.perf_counter() - started
    grads = {n: p.grad for n, p in net.named_parameters()}
    return meter.peak / GB, seconds, value, grads


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--tokens", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = {kind: step(kind, args.vocab, args.tokens) for kind in ("plain", "chunked")}
    (p_peak, _, p_loss, p_grads), (c_peak, _, c_loss, c_grads) = rows["plain"], rows["chunked"]
    chunk = chunk_tokens(args.vocab)
    priced = {kind: planner_loss_gb(kind, args.vocab, args.tokens) for kind in rows}
    print(f"vocabulary {args.vocab:,}, {args.tokens:,} tokens, fp32 (a chunk: {chunk} tokens)")
    print(
        f"{'loss':8s} {'peak GB (step)':>15s} {'planner logits GB':>18s} {'seconds':>8s} {'loss value':>14s}"
    )
    for kind, (peak, seconds, value, _) in rows.items():
        print(f"{kind:8s} {peak:15.3f} {priced[kind]:18.3f} {seconds:8.2f} {value:14.6f}")
    loss_rel = abs(c_loss - p_loss) / abs(p_loss)
    worst_name, worst = "", 0.0
    for name, grad in p_grads.items():
        other = c_grads[name]
        diff = float((other - grad).abs().max()) / max(float(grad.abs().max()), 1e-12)
        if diff > worst:
            worst_name, worst = name, diff
    ratio = p_peak / max(c_peak, 1e-9)
    print(
        f"\npeak memory: chunked {c_peak:.3f} GB vs plain {p_peak:.3f} GB ({ratio:.1f}x less, "
        f"{p_peak - c_peak:.2f} GB saved)"
    )
    print(
        f"loss relative difference {loss_rel:.2e}; largest gradient difference (relative to the tensor's "
        f"largest entry) {worst:.2e} on {worst_name} ({len(p_grads)} parameters compared)"
    )
    ok = loss_rel <= 1e-5 and worst <= 1e-5
    print("match to 1e-5: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
