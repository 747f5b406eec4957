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

With `expandable=True` it follows `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (the same file's
ExpandableSegment, find_expandable_block, try_allocate_expandable_block, map_block, unmap_block): per pool one
segment of virtual address space as large as the card, mapped in pages (2 MB for the small pool, 20 MB for the
large one) as requests need them. A request no free block fits extends the free block at the end of the mapped
part (or the free blocks just before an unmapped hole) by mapping only what is missing, instead of a new
segment of the request's whole size; any remainder of at least 512 B is split off (should_split); mapped and
unmapped blocks never merge; emptying the cache (or running short of the capacity) unmaps every whole page of
every free block, wherever it lies. So shapes that vary step to step grow the reserved memory only by what the
largest step needs beyond what is free at the end, and a card short of memory needs about the allocated peak.

Checked against published peaks by replaying traced allocation sequences (bench/allocator_replay), and
against the real allocator's own trace of varying-length LoRA steps on an H200 (bench/gpu_check/mechanisms.py,
tests/planner/test_allocator.py).
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
VIRTUAL_SEGMENT = 1 << 40  # an expandable segment's address space (the card's memory x 1.125 in PyTorch)
SEGMENT_STRIDE = 2 * VIRTUAL_SEGMENT  # expandable segments start at multiples of this (page arithmetic)


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


class _NeedMemory(Exception):
    """Mapping more pages would pass the capacity: give back the cached pages and try once more."""


@dataclass(eq=False)
class _Block:
    addr: int
    size: int
    small: bool
    free: bool = True
    mapped: bool = True  # False: address space of an expandable segment with no memory behind it
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


def _free_mapped(block: _Block | None) -> bool:
    return block is not None and block.free and block.mapped


@dataclass
class CachingAllocator:
    capacity: int | None = None
    expandable: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    peak_allocated: int = 0
    _pools: dict[bool, list[tuple[int, int, _Block]]] = field(default_factory=lambda: {True: [], False: []})
    _live: dict[object, _Block] = field(default_factory=dict)
    _next_addr: int = 0
    _unmapped: dict[bool, list[tuple[int, _Block]]] = field(default_factory=lambda: {True: [], False: []})

    def malloc(self, handle: object, nbytes: int) -> None:
        """Allocate `nbytes` for `handle` (any hashable name the caller frees it by)."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool.pop(i)[2]
        elif self.expandable:
            try:
                block = self._expand(size, small)
            except _NeedMemory:
                self._release_free_segments()
                pool = self._pools[small]
                i = bisect.bisect_left(pool, (size, -1))
                try:
                    block = pool.pop(i)[2] if i < len(pool) else self._expand(size, small)
                except _NeedMemory:
                    raise OutOfMemory(
                        f"{size} bytes with {self.allocated} allocated, {self.reserved} reserved"
                    ) from None
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
        if (small or self.expandable) and rest >= MIN_BLOCK or (not small and rest > SMALL_SIZE):
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
        if _free_mapped(block.next):
            self._remove(block.next)
            _merge(block, block.next)
        if _free_mapped(block.prev):
            self._remove(block.prev)
            block = _merge(block.prev, block)
        self._insert(block)

    def reset_peak(self) -> None:
        """torch.cuda.reset_peak_memory_stats()."""
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): free segments given back (expandable: every whole free page unmapped)."""
        self._release_free_segments()

    # ---- expandable segments
    def _expand(self, size: int, small: bool) -> _Block:
        """A free mapped block of at least `size`, made by mapping pages after a free block (or into a hole
        of unmapped address space): find_expandable_block + try_allocate_expandable_block."""
        page = SMALL_BUFFER if small else LARGE_BUFFER
        candidate = None
        for _, hole in self._unmapped[small]:
            start = hole.prev if _free_mapped(hole.prev) else hole
            room, b = 0, start
            while b is not None and b.free and room < size:
                room += b.size
                b = b.next
            if room >= size:
                candidate = start
                break
        if candidate is None:  # a new segment of address space, nothing mapped yet
            start = -(-self._next_addr // SEGMENT_STRIDE) * SEGMENT_STRIDE
            candidate = _Block(start, VIRTUAL_SEGMENT, small, mapped=False)
            self._next_addr = start + SEGMENT_STRIDE
            self._insert_unmapped(candidate)
        if not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, size), page)
        while candidate.size < size:
            assert candidate.next is not None and not candidate.next.mapped
            candidate = self._map(candidate.next, min(size - candidate.size, candidate.next.size), page)
        self._remove(candidate)
        return candidate

    def _map(self, hole: _Block, nbytes: int, page: int) -> _Block:
        """Map the first `nbytes` (whole pages) of an unmapped block; the mapped part joins a free mapped
        block before it. Returns the free mapped block holding it (in its pool)."""
        nbytes = min(hole.size, -(-nbytes // page) * page)
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            raise _NeedMemory
        self._remove_unmapped(hole)
        if nbytes < hole.size:
            rest = _Block(hole.addr + nbytes, hole.size - nbytes, hole.small, mapped=False, prev=hole)
            rest.next = hole.next
            if hole.next is not None:
                hole.next.prev = rest
            hole.next = rest
            hole.size = nbytes
            self._insert_unmapped(rest)
        hole.mapped = True
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        block = hole
        if _free_mapped(block.next):  # map_block merges with both free neighbours (try_merge_blocks)
            self._remove(block.next)
            _merge(block, block.next)
        if _free_mapped(block.prev):
            self._remove(block.prev)
            block = _merge(block.prev, block)
        self._insert(block)
        return block

    def _unmap_free_pages(self) -> None:
        """unmap_block on every free mapped block of an expandable segment: its whole pages go back."""
        for small in (True, False):
            page = SMALL_BUFFER if small else LARGE_BUFFER
            for entry in list(self._pools[small]):
                block = entry[2]
                seg_start = block.addr - block.addr % SEGMENT_STRIDE
                begin = seg_start + -(-(block.addr - seg_start) // page) * page
                end = seg_start + (block.addr + block.size - seg_start) // page * page
                if end <= begin:
                    continue
                self._remove(block)
                if begin > block.addr:  # a free mapped piece stays before the hole
                    before = _Block(block.addr, begin - block.addr, small, prev=block.prev, next=block)
                    if block.prev is not None:
                        block.prev.next = before
                    block.prev = before
                    self._insert(before)
                if end < block.addr + block.size:
                    after = _Block(end, block.addr + block.size - end, small, prev=block, next=block.next)
                    if block.next is not None:
                        block.next.prev = after
                    block.next = after
                    self._insert(after)
                block.addr, block.size, block.mapped = begin, end - begin, False
                self.reserved -= block.size
                if block.next is not None and not block.next.mapped:
                    self._remove_unmapped(block.next)
                    _merge(block, block.next)
                if block.prev is not None and not block.prev.mapped:
                    self._remove_unmapped(block.prev)
                    block = _merge(block.prev, block)
                self._insert_unmapped(block)

    def _insert_unmapped(self, block: _Block) -> None:
        bisect.insort(self._unmapped[block.small], (block.addr, block))

    def _remove_unmapped(self, block: _Block) -> None:
        holes = self._unmapped[block.small]
        i = bisect.bisect_left(holes, (block.addr,))
        assert holes[i][1] is block
        holes.pop(i)

    def _release_free_segments(self) -> None:
        """Give back every segment that is one free block (as PyTorch does before out of memory); with
        expandable segments, every whole free page."""
        if self.expandable:
            self._unmap_free_pages()
            return
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


def replay(events: list[Event], capacity: int | None = None, expandable: bool = False) -> CachingAllocator:
    """Run an allocation sequence; raises OutOfMemory if it does not fit in `capacity`."""
    alloc = CachingAllocator(capacity=capacity, expandable=expandable)
    for event in events:
        if event[0] == "+":
            alloc.malloc(event[1], event[2])
        else:
            alloc.free(event[1])
    return alloc


def smallest_capacity(events: list[Event], resolution: int = 32 << 20, expandable: bool = False) -> int:
    """The least memory (to `resolution`) the sequence runs in: between its allocated and reserved peaks."""
    roomy = replay(events, expandable=expandable)
    lo, hi = roomy.peak_allocated - 1, roomy.peak_reserved
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        try:
            replay(events, mid, expandable)
        except OutOfMemory:
            lo = mid
        else:
            hi = mid
    return hi
