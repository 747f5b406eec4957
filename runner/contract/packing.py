"""Planning batches: which examples go in which row, in a seeded order that is the same on every resume.

A plan is a list of micro-batches; each micro-batch a list of rows; each row a list of example indices
(one index without packing, several with packing). Plans are cheap (ints only), so the trainer can
build the whole epoch's plan up front and materialise tensors one batch at a time.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

Row = list[int]
Plan = list[list[Row]]


def epoch_rng(seed: int, epoch: int) -> random.Random:
    """A generator that depends only on (seed, epoch): string seeds hash the same in every process."""
    return random.Random(f"tunebot:{seed}:{epoch}")


GROUP_WINDOW = 64  # micro-batches whose examples are sorted by length together (unpacked, length-grouped)


def plan_unpacked(lengths: Sequence[int], *, micro_batch_size: int, rng: random.Random) -> Plan:
    """One example per row, grouped by length: shuffle, sort each window of GROUP_WINDOW micro-batches' worth
    of examples by length, chunk it into micro-batches and shuffle the micro-batches (the last, short one
    stays last). Rows of a micro-batch are padded to its longest, so grouping similar lengths pads little
    (what transformers' group_by_length does); the epoch's order stays random between micro-batches. The
    widest micro-batch, which sets the memory peak, is the same as without grouping."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if micro_batch_size == 1:
        return [[[i]] for i in order]
    window = GROUP_WINDOW * micro_batch_size
    batches: Plan = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: -lengths[i])
        batches += [
            [[i] for i in chunk[s : s + micro_batch_size]] for s in range(0, len(chunk), micro_batch_size)
        ]
    short = batches.pop() if len(batches[-1]) < micro_batch_size else None
    rng.shuffle(batches)
    return batches + ([short] if short else [])


def pack_rows(lengths: Sequence[int], *, capacity: int, rng: random.Random) -> list[Row]:
    """Best-fit-decreasing bin packing of example lengths into rows of ``capacity`` tokens.

    Ties are broken by a seeded shuffle so equal-length examples do not always share rows; rows are
    shuffled afterwards so long and short rows are mixed through the epoch.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order.sort(key=lambda i: -min(lengths[i], capacity))
    rows: list[Row] = []
    free: list[tuple[int, int]] = []  # (remaining capacity, row index), kept sorted
    for index in order:
        size = min(lengths[index], capacity)
        at = bisect.bisect_left(free, (size, -1))
        if at < len(free):
            remaining, row = free.pop(at)
        else:
            remaining, row = capacity, len(rows)
            rows.append([])
        rows[row].append(index)
        if remaining - size > 0:
            bisect.insort(free, (remaining - size, row))
    rng.shuffle(rows)
    return rows


def plan_packed(lengths: Sequence[int], *, seq_len: int, micro_batch_size: int, rng: random.Random) -> Plan:
    rows = pack_rows(lengths, capacity=seq_len, rng=rng)
    return [rows[start : start + micro_batch_size] for start in range(0, len(rows), micro_batch_size)]
