"""PyTorch's CUDA caching allocator, emulated: what `torch.cuda.max_memory_reserved()` ends up at.

Reserved memory is not the sum of live tensors. The caching allocator (c10/cuda/CUDACachingAllocator.cpp,
default settings) asks the driver for segments and never gives them back during training (no
`empty_cache`, no out-of-memory retry on a card with room to spare). A later tensor reuses a freed block
only when it fits in one piece, and a small long-lived tensor carved out of a large freed block pins that
block's segment. So a phase with big short-lived tensors (quantizing weights on the GPU, say) leaves a
reserved high-water mark that the training step then runs inside.

The rules kept here, all from that file:
- sizes round up to 512 B; requests of at most 1 MB use the small pool, larger ones the large pool;
- a new segment is 2 MB for small requests, 20 MB for requests under 10 MB, else the request rounded up
  to 2 MB;
- a request takes the smallest free block of its pool that is large enough (best fit);
- the block is split when the remainder is at least 512 B (small pool) or more than 1 MB (large pool);
  the request keeps the front, the remainder stays free;
- a freed block merges with free neighbours of the same segment.

With a `capacity` (the card's memory), a request that would need a new segment beyond it first makes the
allocator give back every cached segment that is entirely free, as PyTorch does before reporting out of
memory; if that is not enough, OutOfMemory. The smallest capacity a sequence runs in is what a card needs,
which can be well below the reserved high-water mark of the same sequence on a roomy card.

Checked against published peaks by replaying traced allocation sequences (bench/allocator_replay).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class OutOfMemory(Exception):
    """The request does not fit in the capacity even after the cached free segments are given back."""


@dataclass(eq=False)
class _Block:
    addr: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> tuple[int, int]:
        return (self.size, self.addr)


def _merge(left: _Block, right: _Block) -> _Block:
    """`right` (the next block of the same segment) joins `left`; returns `left`."""
    left.size += right.size
    left.next = right.next
    if right.next is not None:
        right.next.prev = left
    return left


@dataclass
class CachingAllocator:
    capacity: int | None = None
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    peak_allocated: int = 0
    _pools: dict[bool, list[tuple[int, int, _Block]]] = field(default_factory=lambda: {True: [], False: []})
    _live: dict[object, _Block] = field(default_factory=dict)
    _next_addr: int = 0

    def malloc(self, handle: object, nbytes: int) -> None:
        """Allocate `nbytes` for `handle` (any hashable name the caller frees it by)."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool.pop(i)[2]
        else:
            seg = segment_size(size)
            if self.capacity is not None and self.reserved + seg > self.capacity:
                self._release_free_segments()
                if self.reserved + seg > self.capacity:
                    raise OutOfMemory(
                        f"{size} bytes with {self.allocated} allocated, {self.reserved} reserved"
                    )
            block = _Block(self._next_addr, seg, small)
            self._next_addr += seg + ROUND_LARGE  # segments are never adjacent
            self.reserved += seg
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block.size - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
            tail = _Block(block.addr + size, rest, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.free = False
        self._live[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, handle: object) -> None:
        block = self._live.pop(handle)
        block.free = True
        self.allocated -= block.size
        if block.next is not None and block.next.free:
            self._remove(block.next)
            _merge(block, block.next)
        if block.prev is not None and block.prev.free:
            self._remove(block.prev)
            block = _merge(block.prev, block)
        self._insert(block)

    def _release_free_segments(self) -> None:
        """Give back every segment that is one free block (as PyTorch does before out of memory)."""
        for small, pool in self._pools.items():
            kept = []
            for entry in pool:
                if entry[2].prev is None and entry[2].next is None:
                    self.reserved -= entry[2].size
                else:
                    kept.append(entry)
            self._pools[small] = kept

    def _insert(self, block: _Block) -> None:
        bisect.insort(self._pools[block.small], (*block.key(), block))

    def _remove(self, block: _Block) -> None:
        pool = self._pools[block.small]
        i = bisect.bisect_left(pool, block.key())
        assert pool[i][2] is block
        pool.pop(i)


Event = tuple  # ("+", handle, nbytes) or ("-", handle)


def replay(events: list[Event], capacity: int | None = None) -> CachingAllocator:
    """Run an allocation sequence; raises OutOfMemory if it does not fit in `capacity`."""
    alloc = CachingAllocator(capacity=capacity)
    for event in events:
        if event[0] == "+":
            alloc.malloc(event[1], event[2])
        else:
            alloc.free(event[1])
    return alloc


def smallest_capacity(events: list[Event], resolution: int = 32 << 20) -> int:
    """The least memory (to `resolution`) the sequence runs in: between its allocated and reserved peaks."""
    roomy = replay(events)
    lo, hi = roomy.peak_allocated - 1, roomy.peak_reserved
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        try:
            replay(events, mid)
        except OutOfMemory:
            lo = mid
        else:
            hi = mid
    return hi
