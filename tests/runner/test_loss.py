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
    head = HeadLoss(model, "chunked", model.config)
    assert check_against_plain(head, model, inputs, labels) is None
    head.scale = 300.0  # as if transformers scaled the logits in a way the chunked loss did not apply
    assert "differs" in (check_against_plain(head, model, inputs, labels) or "")
