"""make_batches(): deterministic per (seed, epoch), padding ignored, packing without cross-contamination and
without a [b, 1, s, s] mask built on the host (issue 37)."""

from __future__ import annotations

import random

import pytest
import torch

from runner.data import IGNORE_INDEX, Batch, Example, label_tokens_in, make_batches, model_inputs, tokens_in


def example(length: int, start: int = 10, line: int = 1, prompt: int = 0) -> Example:
    ids = [start + (i % 50) for i in range(length)]
    labels = [IGNORE_INDEX] * max(prompt, 1) + ids[max(prompt, 1) :]
    return Example(input_ids=ids, labels=labels, source_line=line)


def skewed(n: int = 60, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    return [
        example(rng.choice([5, 7, 9, 12, 40]), start=rng.randrange(10, 300), line=i + 1) for i in range(n)
    ]


def as_lists(batches) -> list[dict[str, list]]:
    return [{k: v.tolist() for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("packing", [False, True])
def test_same_seed_and_epoch_give_the_same_batches(packing):
    examples = skewed()
    kwargs = dict(seq_len=48, micro_batch_size=3, packing=packing, attn="sdpa", seed=7)
    first = make_batches(examples, epoch=2, **kwargs)
    again = make_batches(examples, epoch=2, **kwargs)
    other_epoch = make_batches(examples, epoch=3, **kwargs)
    assert as_lists(first) == as_lists(again)
    assert as_lists(first) != as_lists(other_epoch)
    # resuming mid-epoch by batch index sees exactly the remaining batches
    assert as_lists(first[4:]) == as_lists(again)[4:]
    assert tokens_in(first) == sum(len(e) for e in examples)  # every example is used once per epoch


def test_unpacked_batches_pad_to_the_longest_and_ignore_padding():
    examples = [example(5, line=1), example(9, line=2)]
    (batch,) = make_batches(
        examples, seq_len=64, micro_batch_size=2, packing=False, attn="sdpa", seed=0, epoch=0, pad_id=0
    )
    assert batch["input_ids"].shape == (2, 9)
    mask = batch["attention_mask"]
    assert mask.shape == (2, 9) and sorted(mask.sum(1).tolist()) == [5, 9]
    assert (batch["labels"][mask == 0] == IGNORE_INDEX).all()
    assert (batch["input_ids"][mask == 0] == 0).all()
    assert isinstance(batch, Batch) and tokens_in(batch) == 14
    assert tokens_in({"attention_mask": mask}) == 14
    assert label_tokens_in(batch) == 4 + 8


def test_packing_fills_rows_and_restarts_positions():
    examples = skewed(80)
    packed = make_batches(
        examples, seq_len=48, micro_batch_size=2, packing=True, attn="sdpa", seed=0, epoch=0
    )
    plain = make_batches(
        examples, seq_len=48, micro_batch_size=2, packing=False, attn="sdpa", seed=0, epoch=0
    )
    rows = sum(b["input_ids"].shape[0] for b in packed)
    assert rows < len(examples) / 3  # short examples share rows
    assert tokens_in(packed) == tokens_in(plain) == sum(len(e) for e in examples)
    for batch in packed:
        b, s = batch["input_ids"].shape
        # nothing s x s: the batch and what the model is handed are [b, s] tensors and the segments' bounds
        assert "attention_mask" not in batch and all(t.dim() <= 2 for t in batch.values())
        inputs, _, _ = model_inputs(batch, "cpu")
        assert all(v.numel() <= b * s + 1 for v in inputs.values() if isinstance(v, torch.Tensor))
        cu = inputs["cu_seq_lens_q"].tolist()
        flat = batch["position_ids"].reshape(-1).tolist()
        assert cu == [i for i, p in enumerate(flat) if p == 0] + [b * s]
        assert inputs["max_length_q"] == max(y - x for x, y in zip(cu, cu[1:], strict=False))
        for row in range(b):
            positions = batch["position_ids"][row].tolist()
            starts = [i for i, p in enumerate(positions) if p == 0]
            for i, p in enumerate(positions):
                assert p == i - max(st for st in starts if st <= i)
            # the first token of every packed example carries no label (no learning across boundaries)
            assert all(batch["labels"][row, st] == IGNORE_INDEX for st in starts)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "flash"])
def test_packed_rows_carry_no_mask_so_varlen_sees_boundaries(attn):
    (batch,) = make_batches(
        [example(5), example(6)], seq_len=16, micro_batch_size=1, packing=True, attn=attn, seed=0, epoch=0
    )
    assert "attention_mask" not in batch
    assert batch["position_ids"][0].tolist()[:11] in ([*range(5), *range(6)], [*range(6), *range(5)])
    inputs, _, index = model_inputs(batch, "cpu")
    assert inputs["cu_seq_lens_q"].tolist() in ([0, 5, 11], [0, 6, 11])
    assert index.tolist() == [i for i, v in enumerate(batch["labels"][0, 1:].tolist()) if v != IGNORE_INDEX]


def test_rejects_unknown_attention():
    with pytest.raises(ValueError, match="attn must be one of"):
        make_batches(
            [example(5)], seq_len=8, micro_batch_size=1, packing=True, attn="xformers", seed=0, epoch=0
        )


def _logits_alone(model, ex: Example) -> torch.Tensor:
    ids = torch.tensor([ex.input_ids])
    with torch.no_grad():
        return model(input_ids=ids).logits[0]


def _varlen_model(data_tiny_llama):
    """The tiny model with runner/attention.py's varlen attention, as the runner loads it on CUDA (on the CPU
    its per-segment SDPA runs the segments the batch's cu_seq_lens name)."""
    from runner import attention

    model = data_tiny_llama("sdpa")
    model.config._attn_implementation = attention.register()
    return model


@pytest.mark.parametrize("attn", ["eager", "sdpa", "varlen", "flash"])
def test_packed_examples_do_not_see_each_other(data_tiny_llama, attn):
    """Logits and per-token loss of each packed example equal those of the example run alone."""
    # "flash" batches are the same; on CPU, transformers' sdpa path detects packed sequences from restarting
    # position_ids the same way flash-attention's varlen path does. "varlen": runner/attention.py.
    model = (
        _varlen_model(data_tiny_llama)
        if attn == "varlen"
        else data_tiny_llama("sdpa" if attn == "flash" else attn)
    )
    a = example(11, start=20, prompt=3)
    b = example(7, start=120, prompt=2)
    c = example(9, start=200, prompt=1)
    (batch,) = make_batches(
        [a, b, c],
        seq_len=32,
        micro_batch_size=1,
        packing=True,
        attn="sdpa" if attn == "varlen" else attn,
        seed=3,
        epoch=0,
    )
    assert batch["input_ids"].shape[0] == 1  # all three share one row
    inputs, _, _ = model_inputs(batch, "cpu")
    with torch.no_grad():
        # use_cache=False as in training: transformers only looks for packed position_ids without a cache
        packed = model(**inputs, use_cache=False).logits[0]
    row_ids = batch["input_ids"][0].tolist()
    positions = batch["position_ids"][0].tolist()
    starts = [i for i, p in enumerate(positions) if p == 0]
    seen = 0
    for ex in (a, b, c):
        start = next(s for s in starts if row_ids[s : s + len(ex)] == ex.input_ids)
        alone = _logits_alone(model, ex)
        piece = packed[start : start + len(ex)]
        torch.testing.assert_close(piece, alone, rtol=1e-4, atol=1e-4)
        labels = torch.tensor(ex.labels)
        loss_alone = torch.nn.functional.cross_entropy(alone[:-1], labels[1:], reduction="none")
        loss_packed = torch.nn.functional.cross_entropy(
            piece[:-1], batch["labels"][0, start + 1 : start + len(ex)], reduction="none"
        )
        torch.testing.assert_close(loss_packed, loss_alone, rtol=1e-4, atol=1e-4)
        seen += 1
    assert seen == 3


@pytest.mark.parametrize("attn", ["sdpa", "varlen"])
def test_the_runners_loss_on_packed_rows_is_the_rows_run_separately(data_tiny_llama, attn):
    """The training loss (runner/loss.py over model_inputs, two rows of several examples each) equals the sum
    of every example's loss run alone: nothing leaks across packed examples or rows."""
    from runner.loss import HeadLoss

    model = _varlen_model(data_tiny_llama) if attn == "varlen" else data_tiny_llama("sdpa")
    examples = [example(n, start=10 + 37 * i, prompt=2) for i, n in enumerate([11, 7, 9, 5, 12, 6])]
    (batch,) = make_batches(
        examples, seq_len=26, micro_batch_size=4, packing=True, attn="sdpa", seed=1, epoch=0
    )
    assert batch["input_ids"].shape[0] >= 2 and "attention_mask" not in batch
    head = HeadLoss(model, "chunked", model.config, chunk=5)
    with torch.no_grad():
        inputs, labels, index = model_inputs(batch, "cpu")
        packed = float(head(model, inputs, labels, index))
        alone = 0.0
        for ex in examples:
            (one,) = make_batches(
                [ex], seq_len=26, micro_batch_size=1, packing=True, attn="sdpa", seed=1, epoch=0
            )
            alone += float(head(model, *model_inputs(one, "cpu")))
    assert packed == pytest.approx(alone, rel=1e-5)
    assert packed > 0


def test_packing_without_the_block_mask_would_leak(data_tiny_llama):
    """Control: the comparison above can fail; a plain causal mask over the row changes B's logits."""
    model = data_tiny_llama("sdpa")
    a, b = example(11, start=20), example(7, start=120)
    (batch,) = make_batches(
        [a, b], seq_len=18, micro_batch_size=1, packing=True, attn="sdpa", seed=0, epoch=0
    )
    row_ids = batch["input_ids"][0].tolist()
    second = b if row_ids[: len(a)] == a.input_ids else a
    with torch.no_grad():
        leaky = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=torch.ones_like(batch["input_ids"]),
        ).logits[0]
    alone = _logits_alone(model, second)
    assert not torch.allclose(leaky[18 - len(second) :], alone, atol=1e-3)


def test_strided_slices_split_an_epoch_between_ranks():
    batches = make_batches(
        skewed(40), seq_len=48, micro_batch_size=2, packing=True, attn="sdpa", seed=1, epoch=0
    )
    ranks = [batches[rank::2] for rank in range(2)]
    assert sorted(len(r) for r in ranks) in (
        [len(batches) // 2] * 2,
        [len(batches) // 2, len(batches) // 2 + 1],
    )
    assert as_lists(ranks[1]) == as_lists(batches)[1::2]
    assert tokens_in(ranks[0]) + tokens_in(ranks[1]) == tokens_in(batches)


def test_packed_rows_work_whatever_dtype_the_query_has(data_tiny_llama):
    """No mask travels with a packed batch, so none can have the wrong dtype: on an H200 the runner's bf16
    mask met the fp32 queries of QLoRA's upcast layers and SDPA refused the first step. fp32 and bf16 models
    train on the same batch."""
    batch_args = dict(seq_len=32, micro_batch_size=1, packing=True, attn="sdpa", seed=3, epoch=0)
    examples = [example(11, start=20, prompt=3), example(7, start=120, prompt=2)]
    (batch,) = make_batches(examples, **batch_args)
    for model in (data_tiny_llama("sdpa"), data_tiny_llama("sdpa").to(torch.bfloat16)):
        inputs, labels, _ = model_inputs(batch, "cpu")
        loss = model(**inputs, labels=labels, use_cache=False).loss
        loss.backward()
        assert torch.isfinite(loss)


def test_only_plain_causal_models_take_the_varlen_kernels():
    """Sliding windows (Mistral's, Gemma's local layers) and soft-capped logits (Gemma 2) are not what the
    varlen kernels compute: such models keep transformers' own attention and its mask."""
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    from runner.attention import plain_causal, varlen_attention

    assert plain_causal(LlamaConfig()) and plain_causal(Qwen2Config())  # Qwen2: use_sliding_window off
    assert not plain_causal(MistralConfig()) and not plain_causal(Gemma2Config()) and not plain_causal(None)
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="plain causal"):
        bounds = torch.tensor([0, 4])
        varlen_attention(torch.nn.Module(), q, q, q, None, sliding_window=2, cu_seq_lens_q=bounds)
