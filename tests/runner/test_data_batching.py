"""make_batches(): deterministic per (seed, epoch), padding ignored, packing without cross-contamination."""

from __future__ import annotations

import random

import pytest
import torch

from runner.data import IGNORE_INDEX, Batch, Example, cast_mask, label_tokens_in, make_batches, tokens_in


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
        assert batch["attention_mask"].shape == (b, 1, s, s)
        for row in range(b):
            positions = batch["position_ids"][row].tolist()
            starts = [i for i, p in enumerate(positions) if p == 0]
            for i, p in enumerate(positions):
                assert p == i - max(st for st in starts if st <= i)
            # the first token of every packed example carries no label (no learning across boundaries)
            assert all(batch["labels"][row, st] == IGNORE_INDEX for st in starts)


def test_flash_packing_has_no_2d_mask_so_varlen_sees_boundaries():
    (batch,) = make_batches(
        [example(5), example(6)], seq_len=16, micro_batch_size=1, packing=True, attn="flash", seed=0, epoch=0
    )
    assert "attention_mask" not in batch
    assert batch["position_ids"][0].tolist()[:11] in ([*range(5), *range(6)], [*range(6), *range(5)])


def test_rejects_unknown_attention():
    with pytest.raises(ValueError, match="attn must be one of"):
        make_batches(
            [example(5)], seq_len=8, micro_batch_size=1, packing=True, attn="xformers", seed=0, epoch=0
        )


def _logits_alone(model, ex: Example) -> torch.Tensor:
    ids = torch.tensor([ex.input_ids])
    with torch.no_grad():
        return model(input_ids=ids).logits[0]


@pytest.mark.parametrize(
    ("attn", "mask_dtype"),
    [("eager", torch.float32), ("sdpa", torch.float32), ("sdpa", torch.bool), ("flash", torch.float32)],
)
def test_packed_examples_do_not_see_each_other(data_tiny_llama, attn, mask_dtype):
    """Logits and per-token loss of each packed example equal those of the example run alone."""
    # "flash" batches carry only position_ids; on CPU, transformers' sdpa path detects packed sequences from
    # restarting position_ids the same way flash-attention's varlen path does.
    model = data_tiny_llama("sdpa" if attn == "flash" else attn)
    a = example(11, start=20, prompt=3)
    b = example(7, start=120, prompt=2)
    c = example(9, start=200, prompt=1)
    (batch,) = make_batches(
        [a, b, c],
        seq_len=32,
        micro_batch_size=1,
        packing=True,
        attn=attn,
        seed=3,
        epoch=0,
        mask_dtype=mask_dtype,
    )
    assert batch["input_ids"].shape[0] == 1  # all three share one row
    with torch.no_grad():
        # use_cache=False as in training: transformers only looks for packed position_ids without a cache
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
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


def test_cast_mask_keeps_blocked_positions_blocked():
    (batch,) = make_batches(
        [example(3), example(4)], seq_len=8, micro_batch_size=1, packing=True, attn="eager", seed=0, epoch=0
    )
    mask = batch["attention_mask"]
    half = cast_mask(mask, torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert torch.equal(half < 0, mask < 0)
    assert torch.isfinite(half).all()


def test_bool_masks_are_for_sdpa_only():
    with pytest.raises(ValueError, match="eager attention adds the mask"):
        make_batches(
            [example(5)],
            seq_len=8,
            micro_batch_size=1,
            packing=True,
            attn="eager",
            seed=0,
            epoch=0,
            mask_dtype=torch.bool,
        )


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


def test_packed_mask_works_whatever_dtype_the_query_has(data_tiny_llama):
    """The mask the runner builds for SDPA fits a query in any dtype. On an H200 the runner built a bf16 mask
    (its compute dtype) while QLoRA (fp32 upcasts by prepare_model_for_kbit_training) and a mixed-precision
    full fine-tune (fp32 master weights) computed fp32 queries: SDPA refused the first step, so both methods
    failed at step 0 on every GPU."""
    from runner.data import mask_dtype_for

    batch_args = dict(seq_len=32, micro_batch_size=1, packing=True, attn="sdpa", seed=3, epoch=0)
    examples = [example(11, start=20, prompt=3), example(7, start=120, prompt=2)]

    def loss_of(model: object, mask_dtype: torch.dtype) -> torch.Tensor:
        (batch,) = make_batches(examples, **batch_args, mask_dtype=mask_dtype)
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return model(**inputs, labels=batch["labels"], use_cache=False).loss

    fp32_model = data_tiny_llama("sdpa")  # fp32 hidden states, as QLoRA's upcast layers produce
    with pytest.raises(RuntimeError, match="attn_mask dtype"):
        loss_of(fp32_model, torch.bfloat16)  # what the runner passed on a GPU (its compute dtype)
    for model in (fp32_model, data_tiny_llama("sdpa").to(torch.bfloat16)):
        loss = loss_of(model, mask_dtype_for("sdpa"))
        loss.backward()
        assert torch.isfinite(loss)
    assert mask_dtype_for("sdpa") is torch.bool and mask_dtype_for("eager") is torch.float32
