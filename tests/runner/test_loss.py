"""The chunked cross-entropy (runner/loss.py) is the plain loss, value and gradients, with less memory."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from runner.contract.spec import chunk_tokens
from runner.loss import HeadLoss, check_against_plain, chunked_loss, plain_loss


def _problem(vocab: int = 3000, hidden: int = 24, batch: int = 2, seq: int = 97, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, seq, hidden, generator=gen, dtype=torch.float32, requires_grad=True)
    w = (torch.randn(vocab, hidden, generator=gen, dtype=torch.float32) * 0.2).requires_grad_()
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    labels[0, :30] = -100  # a prompt
    labels[1, -5:] = -100  # padding
    return h, w, labels


def _reference(
    h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, scale: float = 1.0, softcap: float = 0.0
) -> torch.Tensor:
    logits = F.linear(h, w) * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return plain_loss(logits, labels)


@pytest.mark.parametrize(("scale", "softcap"), [(1.0, 0.0), (0.25, 0.0), (1.0, 30.0)])
def test_chunked_loss_and_its_gradients_equal_the_plain_loss(scale: float, softcap: float) -> None:
    h, w, labels = _problem()
    expected = _reference(h, w, labels, scale, softcap)
    gh, gw = torch.autograd.grad(expected, (h, w))
    for chunk in (1, 7, 50, 10_000):  # one token per chunk, uneven chunks, one chunk for everything
        got = chunked_loss(h, w, None, labels, scale=scale, softcap=softcap, chunk=chunk)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        ch, cw = torch.autograd.grad(got, (h, w))
        torch.testing.assert_close(ch, gh, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cw, gw, rtol=1e-5, atol=1e-5)


def test_no_label_token_gives_a_zero_loss_that_backward_still_reaches() -> None:
    h, w, labels = _problem()
    loss = chunked_loss(h, w, None, torch.full_like(labels, -100))
    loss.backward()
    assert float(loss) == 0.0 and h.grad is not None and float(h.grad.abs().sum()) == 0.0


def test_a_chunk_holds_at_most_the_priced_number_of_logits() -> None:
    assert chunk_tokens(128_256) == 130 and chunk_tokens(32_000) == 524 and chunk_tokens(10**9) == 1


def _tiny_llama(vocab: int = 400, seed: int = 0, **config: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **config,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def _batch(vocab: int = 400, seq: int = 80) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, seq), generator=gen)
    labels = ids.clone()
    labels[:, :20] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, labels


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_head_loss_trains_the_model_exactly_as_the_plain_loss(method: str) -> None:
    """Inside the model's own forward (a pre-hook on lm_head): same loss, same gradient on every parameter."""
    grads = []
    for kind in ("plain", "chunked"):
        model = _tiny_llama()
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
            model = get_peft_model(model, config)
        inputs, labels = _batch()
        head = HeadLoss(model, kind, model.config, chunk=17)
        loss = head(model, inputs, labels)
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (plain, plain_grads), (chunked, chunked_grads) = grads
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
    assert plain_grads.keys() == chunked_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_the_start_check_catches_a_head_the_loss_does_not_know() -> None:
    model = _tiny_llama()
    inputs, labels = _batch()
    batch = {**inputs, "labels": labels}
    head = HeadLoss(model, "chunked", model.config)
    assert check_against_plain(head, model, batch, "cpu") is None
    head.scale = 300.0  # as if transformers scaled the logits in a way the chunked loss did not apply
    assert "differs" in (check_against_plain(head, model, batch, "cpu") or "")


# Ops whose output size depends on the data: on a GPU each one makes the host wait for the device (the host
# must learn the size before it can go on), and aten._local_scalar_dense is every read of a value (.item(),
# float(), int(), bool() of a tensor).
SYNCING_OPS = ("nonzero", "masked_select", "_local_scalar_dense", "unique", "_unique2")


def _boolean_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


class _SyncCounter:
    """Every op dispatched while active; ``syncs``: those that wait for the device on a GPU."""

    def __enter__(self) -> _SyncCounter:
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = self.ops = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                name = func.overloadpacket.__name__
                if name in ("index", "index_put", "index_put_") and _boolean_index(args):
                    name = "masked_select"  # a boolean mask as an index: nonzero inside the kernel
                seen.append(name)
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)

    @property
    def syncs(self) -> list[str]:
        return [op for op in self.ops if any(op == s or op.startswith(s + "_") for s in SYNCING_OPS)]


@pytest.mark.parametrize("kind", ["chunked", "plain"])
def test_the_loss_forward_and_backward_never_wait_for_the_device(kind: str) -> None:
    """Issue 37: ``hidden[:, :-1][keep]`` (a boolean mask: nonzero, then a copy of its size to the host)
    synced the GPU with the host in the middle of every forward. With the positions that carry loss worked out
    on the host (runner/data/batching.model_inputs), no op of the loss's forward and backward has a
    data-dependent size, and the value equals the plain loss over the same label tokens."""
    from runner import attention
    from runner.data import Example, make_batches, model_inputs

    model = _tiny_llama()
    # as the runner runs it on CUDA: packed rows through runner/attention.py (no mask for transformers to
    # build and check), the batch's sizes worked out on the host
    model.config._attn_implementation = attention.register()
    gen = torch.Generator().manual_seed(3)
    examples = []
    for i, n in enumerate([30, 17, 41, 25, 9]):
        ids = torch.randint(0, 400, (n,), generator=gen).tolist()
        examples.append(Example(input_ids=ids, labels=[-100] * 6 + ids[6:], source_line=i))
    (batch,) = make_batches(
        examples, seq_len=64, micro_batch_size=2, packing=True, attn="sdpa", seed=0, epoch=0
    )
    model_kwargs, labels, index = model_inputs(batch, "cpu")
    head = HeadLoss(model, kind, model.config, chunk=17)
    with _SyncCounter() as counted:
        loss = head(model, model_kwargs, labels, index)
        loss.backward()
    assert counted.ops and counted.syncs == []
    with torch.no_grad():
        expected = plain_loss(model(**model_kwargs).logits, labels)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-5)
    assert index.numel() == batch.num_label_tokens < labels[:, 1:].numel()


def test_the_counter_sees_the_boolean_mask_that_synced() -> None:
    """Control: the selection the loss used to make is counted."""
    h, _, labels = _problem()
    with _SyncCounter() as counted:
        h[:, :-1][labels[:, 1:] != -100].sum()
    assert "masked_select" in counted.syncs


def test_without_liger_the_run_says_why_and_trains_with_the_plans_loss(
    runner_job: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Liger's kernels are the default on CUDA (JobSpec.kernels "liger"); on a host where they cannot run
    (this CPU, no liger-kernel) the run goes on with torch and says why in its log. loss=liger, refused on
    9a0c9c1 where Liger was missing (an invalid job), trains with the chunked loss and says so."""
    from runner.contract.spec import EXIT_OK, Defaults
    from runner.kernels import liger_problem
    from runner.train import run

    assert Defaults.kernels == "liger" and liger_problem() is not None
    for loss, trained in (("chunked", "chunked"), ("liger", "chunked"), ("plain", "plain")):
        summary, code = run(runner_job(max_steps=2, seq_len=128, loss=loss, samples={"count": 0}))
        out = capsys.readouterr().out
        assert code == EXIT_OK and summary.status == "finished", (loss, summary)
        assert f"kernels: torch, not Liger: {liger_problem()}; loss: {trained} cross-entropy" in out
        assert f"loss: {trained} cross-entropy" in out
        assert ("loss=liger needs Liger's kernels" in out) == (loss == "liger")
