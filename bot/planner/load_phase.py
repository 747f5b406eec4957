"""The memory a QLoRA job reserves before its first step: quantizing the base weights on the GPU.

QLoRA stacks that quantize a 16-bit checkpoint on the GPU hold, for each Linear in turn, its bf16 copy and
the quantizer's scratch tensors next to every weight quantized so far. The caching allocator keeps what
that high-water mark reserved (bot/planner/allocator.py), and the training step then runs inside it: when
the scratch is large, loading, not training, sets the peak reserved memory a user sees.

Quantizers (`EstimateRequest.nf4_quantizer`; the stack picks one by default):
- "bitsandbytes" (Hugging Face load_in_4bit): the bf16 weight plus the packed output and fp32 absmax
  (double quantization shrinks it after): about 2.6 B per parameter of the Linear being quantized.
- "torchao" (torchao >= 0.2, torchtune): quantizes in chunks of 2**20 elements; bf16 weight, scaled
  blocks, one byte per element of indices and the two packed halves: about 6 B per parameter, plus
  ~80 MB of chunk scratch.
- "prequantized" (Unsloth's -bnb-4bit checkpoints): nothing is quantized on the GPU.
- "torchao-0.1" (torchtune 0.1.x pins torchao 0.1): the whole tensor at once, with a (numel, 16)
  distance table in bf16 and its absolute value: 68 B per parameter. The Linear is built on the GPU and
  quantized, then quantized again when the checkpoint is loaded into it. This sequence was traced tensor
  by tensor (bench/allocator_replay/trace.py profile) and is replayed through the allocator emulation,
  because its scratch is large enough that fragmentation, not the sum of sizes, decides what is reserved.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from bot.planner.allocator import CachingAllocator
from bot.planner.architectures import Architecture

# Scratch bytes per parameter of the largest Linear, for quantizers whose scratch is small enough that the
# sum of sizes is the high-water mark.
SCRATCH_BYTES = {"bitsandbytes": 2.6, "torchao": 6.0, "prequantized": 0.0}
TORCHAO_CHUNK_SCRATCH = 80e6

F = Fraction
# torchao 0.1 under torchtune 0.1.x, per block Linear with n parameters: ("+", id, bytes per parameter,
# constant bytes) or ("-", id), in order. Recorded by `bench/allocator_replay/trace.py profile` (the LoRA
# adapters, which do not scale with n, are allocated separately).
# BUILD: nn.Linear's bf16 weight made on the GPU (id 0) and quantized by to_nf4; survivors 4, 11, 15, 26.
_BUILD: list[tuple] = [
    ("+", 0, F(2), 0),
    ("+", 1, F(2), 0),
    ("+", 2, F(1, 32), 0),
    ("+", 3, F(1, 8), 0),
    ("-", 1),
    ("-", 3),
    ("+", 4, F(0), 2),
    ("+", 5, F(1, 32), 0),
    ("-", 2),
    ("+", 6, F(1, 32), 0),
    ("+", 7, F(1, 8192), 0),
    ("+", 8, F(1, 2048), 0),
    ("-", 6),
    ("-", 8),
    ("+", 9, F(1, 32), 0),
    ("+", 10, F(1, 32), 0),
    ("+", 11, F(1, 32), 0),
    ("-", 10),
    ("-", 9),
    ("+", 12, F(1, 32), 0),
    ("+", 13, F(1, 32), 0),
    ("-", 12),
    ("+", 14, F(1, 32), 0),
    ("-", 13),
    ("+", 15, F(1, 64), 0),
    ("-", 5),
    ("-", 7),
    ("-", 14),
    ("+", 16, F(2), 0),
    ("+", 17, F(1, 32), 0),
    ("+", 18, F(1, 8), 0),
    ("-", 16),
    ("-", 18),
    ("+", 19, F(2), 0),
    ("+", 20, F(32), 0),
    ("+", 21, F(32), 0),
    ("-", 20),
    ("+", 22, F(2), 0),
    ("+", 23, F(8), 0),
    ("-", 22),
    ("-", 21),
    ("+", 24, F(4), 0),
    ("+", 25, F(4), 0),
    ("-", 24),
    ("+", 26, F(1, 2), 0),
    ("-", 17),
    ("-", 19),
    ("-", 23),
    ("-", 25),
    ("-", 0),
]
# CLONE: copy.deepcopy of the block (torchtune 0.1.x builds one block and clones it per layer): the NF4
# clone dequantizes (int64 indices) and quantizes again; survivors 40-44.
_CLONE: list[tuple] = [
    ("+", 0, F(1, 2), 0),
    ("+", 1, F(4), 0),
    ("-", 0),
    ("+", 2, F(1, 2), 0),
    ("+", 3, F(4), 0),
    ("-", 2),
    ("+", 4, F(1), 0),
    ("+", 5, F(1), 0),
    ("+", 6, F(1, 32), 0),
    ("+", 7, F(1, 32), 0),
    ("-", 6),
    ("+", 8, F(1), 0),
    ("+", 9, F(1), 0),
    ("-", 8),
    ("+", 10, F(1), 0),
    ("+", 11, F(1), 0),
    ("-", 10),
    ("+", 12, F(2), 0),
    ("-", 1),
    ("-", 3),
    ("-", 4),
    ("-", 5),
    ("-", 7),
    ("-", 9),
    ("-", 11),
    ("+", 13, F(0), 32),
    ("+", 14, F(2), 0),
    ("+", 15, F(1, 32), 0),
    ("+", 16, F(1, 8), 0),
    ("-", 14),
    ("-", 16),
    ("+", 17, F(0), 2),
    ("+", 18, F(1, 32), 0),
    ("-", 15),
    ("+", 19, F(1, 32), 0),
    ("+", 20, F(1, 8192), 0),
    ("+", 21, F(1, 2048), 0),
    ("-", 19),
    ("-", 21),
    ("+", 22, F(1, 32), 0),
    ("+", 23, F(1, 32), 0),
    ("+", 24, F(1, 32), 0),
    ("-", 23),
    ("-", 22),
    ("+", 25, F(1, 32), 0),
    ("+", 26, F(1, 32), 0),
    ("-", 25),
    ("+", 27, F(1, 32), 0),
    ("-", 26),
    ("+", 28, F(1, 64), 0),
    ("-", 18),
    ("-", 20),
    ("-", 27),
    ("+", 29, F(2), 0),
    ("+", 30, F(1, 32), 0),
    ("+", 31, F(1, 8), 0),
    ("-", 29),
    ("-", 31),
    ("+", 32, F(2), 0),
    ("+", 33, F(32), 0),
    ("+", 34, F(32), 0),
    ("-", 33),
    ("+", 35, F(2), 0),
    ("+", 36, F(8), 0),
    ("-", 35),
    ("-", 34),
    ("+", 37, F(4), 0),
    ("+", 38, F(4), 0),
    ("-", 37),
    ("+", 39, F(1, 2), 0),
    ("-", 30),
    ("-", 32),
    ("-", 36),
    ("-", 38),
    ("-", 12),
    ("+", 40, F(1, 64), 0),
    ("+", 41, F(1, 8192), 0),
    ("+", 42, F(0), 2),
    ("+", 43, F(1, 2), 0),
    ("+", 44, F(0), 32),
    ("-", 28),
    ("-", 24),
    ("-", 17),
    ("-", 39),
    ("-", 13),
]
# LOAD: load_state_dict copies a host bf16 tensor in (id 0: the host-to-GPU copy), quantizes it, and
# frees the clone's NF4 storages (ids 28-32 here: the clone's survivors 40-44).
_LOAD: list[tuple] = [
    ("+", 0, F(2), 0),
    ("+", 1, F(0), 32),
    ("+", 2, F(2), 0),
    ("+", 3, F(1, 32), 0),
    ("+", 4, F(1, 8), 0),
    ("-", 2),
    ("-", 4),
    ("+", 5, F(0), 2),
    ("+", 6, F(1, 32), 0),
    ("-", 3),
    ("+", 7, F(1, 32), 0),
    ("+", 8, F(1, 8192), 0),
    ("+", 9, F(1, 2048), 0),
    ("-", 7),
    ("-", 9),
    ("+", 10, F(1, 32), 0),
    ("+", 11, F(1, 32), 0),
    ("+", 12, F(1, 32), 0),
    ("-", 11),
    ("-", 10),
    ("+", 13, F(1, 32), 0),
    ("+", 14, F(1, 32), 0),
    ("-", 13),
    ("+", 15, F(1, 32), 0),
    ("-", 14),
    ("+", 16, F(1, 64), 0),
    ("-", 6),
    ("-", 8),
    ("-", 15),
    ("+", 17, F(2), 0),
    ("+", 18, F(1, 32), 0),
    ("+", 19, F(1, 8), 0),
    ("-", 17),
    ("-", 19),
    ("+", 20, F(2), 0),
    ("+", 21, F(32), 0),
    ("+", 22, F(32), 0),
    ("-", 21),
    ("+", 23, F(2), 0),
    ("+", 24, F(8), 0),
    ("-", 23),
    ("-", 22),
    ("+", 25, F(4), 0),
    ("+", 26, F(4), 0),
    ("-", 25),
    ("+", 27, F(1, 2), 0),
    ("-", 18),
    ("-", 20),
    ("-", 24),
    ("-", 26),
    ("-", 0),
    ("-", 28),
    ("-", 29),
    ("-", 30),
    ("-", 31),
    ("-", 32),
]
_BUILD_SURVIVORS = (4, 11, 15, 26)
_LOAD_FREES_CLONE = {28: 40, 29: 41, 30: 42, 31: 43, 32: 44}


def peak_bytes_per_param(events: list[tuple]) -> Fraction:
    """The most bytes per parameter a profile holds at once (its per-parameter scratch + result)."""
    live: dict[object, Fraction] = {}
    peak = Fraction(0)
    for event in events:
        if event[0] == "+":
            live[event[1]] = event[2]
            peak = max(peak, sum(live.values()))
        else:
            live.pop(event[1], None)
    return peak


def _replay(alloc: CachingAllocator, events: list[tuple], n: int, prefix: tuple, rename: dict) -> None:
    for event in events:
        ident = rename.get(event[1], (*prefix, event[1]))
        if event[0] == "+":
            alloc.malloc(ident, int(event[2] * n) + event[3])
        else:
            alloc.free(ident)


def _adapters(alloc: CachingAllocator, prefix: tuple, d_in: int, d_out: int, rank: int) -> None:
    alloc.malloc((*prefix, "lora_a"), 2 * rank * d_in)
    alloc.malloc((*prefix, "lora_b"), 2 * rank * d_out)


@lru_cache(maxsize=64)
def _torchao_01_reserved(
    groups: tuple[tuple[int, tuple[tuple[int, int], ...]], ...], embeddings: tuple[int, ...], rank: int
) -> int:
    """Peak reserved bytes of torchtune 0.1.x building a QLoRA model on the GPU and loading a checkpoint.

    The builder makes one block (each Linear quantized as it is made), then the 16-bit embeddings and
    output projection, then deep-copies the block once per layer; the prototype goes when the builder
    returns; load_state_dict then re-quantizes every NF4 weight from the host checkpoint.
    `groups`: (layers, ((d_in, d_out) per block Linear in module order)).
    """
    alloc = CachingAllocator()
    for g, (_, shapes) in enumerate(groups):
        for j, (d_in, d_out) in enumerate(shapes):
            _replay(alloc, _BUILD, d_in * d_out, ("proto", g, j), {})
            _adapters(alloc, ("proto", g, j), d_in, d_out, rank)
    for i, nbytes in enumerate(embeddings):
        alloc.malloc(("embedding", i), nbytes)
    for g, (layers, shapes) in enumerate(groups):
        for layer in range(layers):
            for j, (d_in, d_out) in enumerate(shapes):
                _replay(alloc, _CLONE, d_in * d_out, ("clone", g, layer, j), {})
                _adapters(alloc, ("clone", g, layer, j), d_in, d_out, rank)
    for g, (_, shapes) in enumerate(groups):
        for j in range(len(shapes)):
            for k in (*_BUILD_SURVIVORS, "lora_a", "lora_b"):
                alloc.free(("proto", g, j, k))
    for g, (layers, shapes) in enumerate(groups):
        for layer in range(layers):
            for j, (d_in, d_out) in enumerate(shapes):
                old = {k: ("clone", g, layer, j, v) for k, v in _LOAD_FREES_CLONE.items()}
                _replay(alloc, _LOAD, d_in * d_out, ("load", g, layer, j), old)
    return alloc.peak_reserved


def load_reserved_bytes(arch: Architecture, quantizer: str, weights: float, lora_r: int) -> float:
    """Reserved bytes at the end of loading a QLoRA model on one GPU (before the first step).

    `weights` is the planner's size of the loaded model (NF4 blocks + 16-bit rest) for the quantizers
    whose scratch is added to it; torchao 0.1 is replayed in full.
    """
    linears = [lin for g in arch.groups for lin in g.linears]
    if quantizer == "torchao-0.1":
        groups = tuple(
            (g.layers, tuple((lin.d_in, lin.d_out) for lin in g.linears for _ in range(lin.count)))
            for g in arch.groups
        )
        embeddings = (2 * arch.vocab * arch.hidden,) + (() if arch.tied else (2 * arch.vocab * arch.hidden,))
        return float(_torchao_01_reserved(groups, embeddings, lora_r))
    largest = max(lin.d_in * lin.d_out for lin in linears)
    scratch = SCRATCH_BYTES[quantizer] * largest
    if quantizer == "torchao":
        scratch += TORCHAO_CHUNK_SCRATCH
    return weights + scratch
