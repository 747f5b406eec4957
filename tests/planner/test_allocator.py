"""The caching-allocator emulation behaves like PyTorch's: what reserved memory a user would see."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.planner.allocator import (
    LARGE_BUFFER,
    CachingAllocator,
    OutOfMemory,
    replay,
    round_size,
    segment_size,
    smallest_capacity,
)

MB = 1 << 20


def test_a_small_long_lived_tensor_carved_from_a_large_free_block_pins_it() -> None:
    a = CachingAllocator()
    a.malloc("scratch", 180 * MB)
    a.free("scratch")
    a.malloc("kept", 12 * MB)  # best fit: the only free block, split
    a.malloc("scratch again", 180 * MB)  # 168 MB left there: not enough, a new segment
    assert a.reserved == 360 * MB
    assert a.allocated == 192 * MB


def test_a_freed_block_is_reused_without_a_new_segment() -> None:
    a = CachingAllocator()
    for i in range(10):
        a.malloc(i, 100 * MB)
        a.free(i)
    assert a.peak_reserved == 100 * MB
    assert a.allocated == 0


def test_neighbours_merge_so_a_larger_request_fits_after_frees() -> None:
    a = CachingAllocator()
    a.malloc("whole", 64 * MB)
    a.free("whole")
    a.malloc("left", 32 * MB)
    a.malloc("right", 32 * MB)
    a.free("left")
    a.free("right")
    a.malloc("whole again", 64 * MB)
    assert a.reserved == 64 * MB


def test_sizes_and_segments_follow_the_cuda_allocator() -> None:
    assert round_size(1) == 512
    assert round_size(513) == 1024
    assert segment_size(512) == 2 * MB  # small pool
    assert segment_size(5 * MB) == 20 * MB  # medium requests share 20 MB segments
    assert segment_size(11 * MB) == 12 * MB  # large: rounded up to 2 MB
    a = CachingAllocator()
    for i in range(4000):
        a.malloc(i, 500)  # 4000 x 512 B fit in one 2 MB small segment
    assert a.reserved == 2 * MB
    a.malloc("medium", 3 * MB)
    a.malloc("medium 2", 3 * MB)
    assert a.reserved == 22 * MB  # both from one 20 MB segment


def test_small_and_large_pools_do_not_share_blocks() -> None:
    a = CachingAllocator()
    a.malloc("large", 30 * MB)
    a.free("large")
    a.malloc("small", 4096)
    assert a.reserved == 32 * MB  # the 30 MB free block is not split for a small request


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 64 * MB)), min_size=1, max_size=80))
def test_accounting_invariants_hold_for_any_sequence(ops: list[tuple[bool, int]]) -> None:
    a = CachingAllocator()
    live: list[int] = []
    for i, (free_one, size) in enumerate(ops):
        if free_one and live:
            a.free(live.pop(size % len(live)))
        else:
            a.malloc(i, size)
            live.append(i)
        assert 0 <= a.allocated <= a.reserved <= a.peak_reserved
        assert a.peak_allocated <= a.peak_reserved
    for handle in live:
        a.free(handle)
    assert a.allocated == 0
    # every byte reserved is free again and merged back: one free block per segment
    free_blocks = [b for pool in a._pools.values() for *_, b in pool]
    assert sum(b.size for b in free_blocks) == a.reserved
    assert all(b.prev is None and b.next is None for b in free_blocks)


def _growing_steps() -> list[tuple]:
    """Steps whose scratch grows (longer batches): each needs a new segment; the old ones end up free."""
    events: list[tuple] = []
    for step, size in enumerate([100, 150, 200, 250, 300]):
        scratch = ("scratch", step)
        events += [("+", scratch, size * MB), ("+", ("kept", step), 4 * MB), ("-", scratch)]
    return events


def test_a_tight_card_gives_cached_segments_back_before_running_out() -> None:
    events = _growing_steps()
    roomy = replay(events)
    assert roomy.peak_reserved >= 1000 * MB  # each longer scratch needed a new segment
    need = smallest_capacity(events, resolution=1 * MB)
    assert roomy.peak_allocated <= need < 0.4 * roomy.peak_reserved  # old scratch segments given back
    replay(events, need)  # fits
    with pytest.raises(OutOfMemory):
        replay(events, need - 2 * MB)


def test_out_of_memory_when_live_tensors_alone_exceed_the_card() -> None:
    a = CachingAllocator(capacity=100 * MB)
    a.malloc("a", 60 * MB)
    with pytest.raises(OutOfMemory):
        a.malloc("b", 60 * MB)


# ---- expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; issue 29) ---------------------


def _varying_steps(seed: int = 0, steps: int = 24) -> list[tuple]:
    """Training steps of varying batch length, as the allocator sees them: each step's activations and loss
    tensors scale with the batch's tokens; the optimizer's states appear after the first backward (lazy init)
    and live on, carved out of whatever is free then; gradients live from backward to the optimizer step."""
    import random

    rng = random.Random(seed)
    events: list[tuple] = [("+", "weights", 2000 * MB)]
    for step in range(steps):
        tokens = rng.choice([1, 2, 3, 4, 6, 8])  # thousands of tokens, padded to the batch's longest
        acts = [("+", (step, "act", i), tokens * 12 * MB) for i in range(16)]
        logits = [("+", (step, "logits", i), tokens * 200 * MB) for i in range(3)]
        events += acts + logits
        events += [("-", e[1]) for e in logits]
        events += [("+", (step, "grad", i), 40 * MB) for i in range(4)]
        events += [("-", e[1]) for e in acts]
        if step == 0:
            events += [("+", ("state", i), 40 * MB) for i in range(8)]
        events += [("-", (step, "grad", i)) for i in range(4)]
    return events


def test_varying_shapes_leave_cached_segments_behind_and_expandable_segments_do_not() -> None:
    """The default allocator caches a new segment for every longer batch and never gives it back on a roomy
    card (reserved far above allocated); expandable segments grow one segment, so reserved stays near the
    allocated peak, and the card needs about the allocated peak either way."""
    events = _varying_steps()
    default, expandable = replay(events), replay(events, expandable=True)
    assert default.peak_allocated == expandable.peak_allocated
    allocated = default.peak_allocated
    assert default.peak_reserved > 1.5 * allocated
    assert expandable.peak_reserved < 1.15 * allocated
    assert smallest_capacity(events, resolution=MB, expandable=True) <= allocated + 2 * LARGE_BUFFER
    assert smallest_capacity(events, resolution=MB) < default.peak_reserved  # cached segments given back


def test_an_expandable_segment_maps_pages_at_its_end_instead_of_a_new_segment() -> None:
    a = CachingAllocator(expandable=True)
    a.malloc("x", 30 * MB)
    assert a.reserved == 40 * MB  # two 20 MB pages of the large pool's one segment
    a.free("x")
    a.malloc("y", 50 * MB)  # the free 40 MB at the end grow by one page, not a new 50 MB segment
    assert a.reserved == 60 * MB and a.allocated == 50 * MB
    a.malloc("small", 4096)  # the small pool maps 2 MB pages of its own segment
    assert a.reserved == 62 * MB
    a.free("y")
    a.malloc("keep", 10 * MB)
    a.empty_cache()  # whole free pages are unmapped wherever they are; the live block keeps its pages
    assert a.reserved == 20 * MB + 2 * MB and a.allocated == 10 * MB + 4096
    a.malloc("z", 45 * MB)  # maps again after the live block
    assert a.allocated == 55 * MB + 4096 and a.reserved >= a.allocated


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 64 * MB)), min_size=1, max_size=60))
def test_expandable_accounting_invariants_hold_for_any_sequence(ops: list[tuple[bool, int]]) -> None:
    a = CachingAllocator(expandable=True)
    live: list[int] = []
    for i, (free_one, size) in enumerate(ops):
        if free_one and live:
            a.free(live.pop(size % len(live)))
        else:
            a.malloc(i, size)
            live.append(i)
        assert 0 <= a.allocated <= a.reserved <= a.peak_reserved
    for handle in live:
        a.free(handle)
    a.empty_cache()
    assert a.allocated == 0 and a.reserved == 0  # every page unmapped again


def test_an_expandable_card_gives_free_pages_back_before_running_out() -> None:
    events = _growing_steps()
    need = smallest_capacity(events, resolution=1 * MB, expandable=True)
    assert need <= replay(events, expandable=True).peak_allocated + 2 * LARGE_BUFFER
    replay(events, need, expandable=True)
    with pytest.raises(OutOfMemory):
        replay(events, need - 24 * MB, expandable=True)


def test_the_emulation_reproduces_the_real_allocator_on_a_traced_h200_run() -> None:
    """The caching allocator's own trace of a real run (bench/gpu_check/mechanisms.py on an H200: LoRA on
    Llama-3.2-1B, 12 micro-batches of up to 8,192 tokens of varying length): replayed through the emulation it
    reserves what torch measured, 114.6 GB for 29.2 GB allocated with the default allocator and 33.9 GB with
    expandable segments (the same requests); the card needs about the allocated peak with expandable segments,
    and the planner's estimate for the request is that need."""
    import gzip
    import json
    from pathlib import Path

    from bot.planner.memory import estimate_memory
    from bot.planner.models import resolve
    from bot.planner.request import EstimateRequest

    path = Path(__file__).parent / "data" / "h200_lora_8192_varying.json.gz"
    data = json.loads(gzip.decompress(path.read_bytes()))
    events = [("+", e[0], e[1]) if len(e) == 2 else ("-", e[0]) for e in data["events"]]
    measured = data["measured"]
    default, expandable = replay(events), replay(events, expandable=True)
    assert default.peak_reserved == pytest.approx(measured["default"]["max_memory_reserved"], rel=0.01)
    assert expandable.peak_reserved == pytest.approx(
        measured["expandable_segments"]["max_memory_reserved"], rel=0.015
    )
    allocated = measured["default"]["max_memory_allocated"]
    assert default.peak_reserved > 3.5 * allocated  # the roomy card's cache: not what a card needs
    need_default = smallest_capacity(events, resolution=64 * MB)
    need_expandable = smallest_capacity(events, resolution=64 * MB, expandable=True)
    assert allocated * 0.99 < need_expandable < allocated * 1.01 < need_default < 1.15 * allocated
    arch = resolve(data["request"]["model"])[0]
    for flag, need, tolerance in ((True, need_expandable, 0.02), (False, need_default, 0.03)):
        req = EstimateRequest(**data["request"], expandable_segments=flag)
        assert estimate_memory(arch, req).torch_reserved_gb * 1e9 == pytest.approx(need, rel=tolerance), flag
