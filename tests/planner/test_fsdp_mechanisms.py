"""FSDP's memory mechanisms (bot/planner/memory.fsdp_terms) against FSDP itself, at tiny scale on gloo.

Two CPU processes wrap a tiny Llama the way the runner does (runner/distributed.wrap:
FullyShardedDataParallel, FULL_SHARD, transformer-block units, peft's wrap policy for LoRA) and read FSDP's
own state while a step runs: which FlatParameters are unsharded (their padded full storage allocated) at every
block's forward and backward, and the unsharded gradient each unit hands to its reduce-scatter
(_runtime_utils._reduce_grad). The planner's terms for the same architecture must match what FSDP holds: the
root unit (embeddings, lm_head, final norm) unsharded from the first forward to the end of backward, one block
in forward, the computed and the BACKWARD_PRE-prefetched block in a full fine-tune's backward, one block with
peft's policy (the prefetch lands on an adapter's unit), and unsharded gradients the size of a unit. On the
CPU nothing runs ahead of the device, so FSDP1's free queue (FSDP_FREE_QUEUE, CUDA only) adds nothing here.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from bot.planner.architectures import from_config
from bot.planner.memory import (
    FITTED_MEMORY,
    FSDP_FREE_QUEUE,
    FSDP_GRAD_UNITS,
    estimate_memory,
    fsdp_terms,
    fsdp_units_in_flight,
)
from bot.planner.request import EstimateRequest

ROOT = Path(__file__).resolve().parents[2]
CFG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": False,
    "head_dim": 16,
}


def _worker(rank: int, world: int, port: int, out: str) -> None:  # pragma: no cover - runs in a child
    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp._runtime_utils as runtime
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import AutoConfig, AutoModelForCausalLM

    from runner.distributed import Group, wrap

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    reduce_grad = runtime._reduce_grad
    for method in ("full", "lora"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**CFG), attn_implementation="sdpa")
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
        fsdp = wrap(model, Group(rank=rank, world=world, device=torch.device("cpu")), "fsdp")
        units = [(u, u._handle) for u in FSDP.fsdp_modules(fsdp) if u._handle is not None]

        def unsharded(units=units, fsdp=fsdp) -> list[tuple[str, int]]:
            return [
                (
                    "root" if u is fsdp else type(u.module).__name__,
                    h.flat_param._unpadded_unsharded_size.numel(),
                )
                for u, h in units
                if h.flat_param._full_param_padded.untyped_storage().size() > 0
            ]

        snaps: list[tuple[str, list]] = []
        layers = [m for m in fsdp.modules() if type(m).__name__.endswith("DecoderLayer")]
        for layer in layers:
            layer.register_forward_pre_hook(lambda m, a, s=snaps, f=unsharded: s.append(("forward", f())))
            layer.register_full_backward_pre_hook(
                lambda m, g, s=snaps, f=unsharded: s.append(("backward", f()))
            )
        grads: list[tuple[int, str]] = []

        def spy(state, handle, grads=grads):
            grad = handle.flat_param.grad
            grads.append((grad.numel(), str(grad.dtype)))
            return reduce_grad(state, handle)

        runtime._reduce_grad = spy
        ids = torch.randint(0, CFG["vocab_size"], (2, 16))
        loss = fsdp(input_ids=ids, labels=ids).loss
        snaps.append(("loss", unsharded()))
        loss.backward()
        snaps.append(("after backward", unsharded()))
        runtime._reduce_grad = reduce_grad
        results[method] = {
            "units": [
                (
                    "root" if u is fsdp else type(u.module).__name__,
                    h.flat_param._unpadded_unsharded_size.numel(),
                )
                for u, h in units
            ],
            "snaps": snaps,
            "grads": grads,
        }
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()
    # End as the runner's own workers do (runner/cli.main): flushed, then os._exit, without the interpreter's
    # finalization. The group outlives destroy_process_group (torch.distributed.nn.functional, first imported
    # once the group exists, keeps it as its functions' default group), so gloo's worker threads run on; one
    # that drops a finished collective after the main thread went on frees a Python object (the thread state
    # the collective captured) and takes the GIL: once the interpreter is finalizing, CPython 3.11 ends that
    # thread with pthread_exit, whose unwinding through torch's noexcept frames calls std::terminate
    # ("terminate called without an active exception", SIGABRT, on a loaded machine; on 9a0c9c1 too).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(out: Path) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sys.path.insert(0, str(ROOT))
    mp.spawn(_worker, args=(2, port, str(out)), nprocs=2, join=True)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> dict:
    pytest.importorskip("peft")
    return _spawn(tmp_path_factory.mktemp("fsdp") / "run.json")


def _blocks(snap: list) -> int:
    return sum(1 for name, _ in snap if name.endswith("DecoderLayer"))


@pytest.mark.slow
def test_the_root_unit_stays_unsharded_through_forward_and_backward(fsdp_run) -> None:
    arch = from_config(CFG, "tiny")
    root_params = arch.embedding_params + arch.global_other_params
    req = EstimateRequest(model="tiny", method="full", precision="fp32", gpus=2)
    terms = fsdp_terms(arch, req, 2, FITTED_MEMORY)
    for method in ("full", "lora"):
        run = fsdp_run[method]
        assert dict(run["units"])["root"] == root_params  # embeddings + untied lm_head + final norm
        during = [s for phase, s in run["snaps"] if phase != "after backward"]
        assert all(["root", root_params] in s for s in during), method  # (JSON: lists)
        assert run["snaps"][-1] == ["after backward", []]  # everything resharded for the optimizer step
    assert terms["root"] == root_params * 4.0  # fp32 on the CPU


@pytest.mark.slow
def test_units_in_flight_are_the_computed_and_the_prefetched_block(fsdp_run) -> None:
    arch = from_config(CFG, "tiny")
    block = max(sum(lin.params for lin in g.linears) + g.other_params for g in arch.groups)
    full = EstimateRequest(model="tiny", method="full", gpus=2)
    lora = EstimateRequest(model="tiny", method="lora", gpus=2)
    for method, req in (("full", full), ("lora", lora)):
        run = fsdp_run[method]
        blocks = [size for name, size in run["units"] if name.endswith("DecoderLayer")]
        assert blocks and set(blocks) == {block}, method  # a unit is one block (adapters apart for LoRA)
        forward = max(_blocks(s) for phase, s in run["snaps"] if phase == "forward")
        backward = max(_blocks(s) for phase, s in run["snaps"] if phase == "backward")
        assert forward == 1, method
        # CUDA adds the free queue's deferred frees for whole-block units; gloo has none
        deferred = FSDP_FREE_QUEUE if method == "full" else 0
        assert backward == fsdp_units_in_flight(req) - deferred, method
    assert fsdp_units_in_flight(full) == 4 and fsdp_units_in_flight(lora) == 1


@pytest.mark.slow
def test_unsharded_gradients_before_reduce_scatter_are_one_unit_each(fsdp_run) -> None:
    arch = from_config(CFG, "tiny")
    block = max(sum(lin.params for lin in g.linears) + g.other_params for g in arch.groups)
    root_params = arch.embedding_params + arch.global_other_params
    grads = fsdp_run["full"]["grads"]
    sizes = [n for n, _ in grads]
    assert sizes.count(block) == arch.layers and sizes[-1] == root_params  # the root's comes last
    assert {dtype for _, dtype in grads} == {"torch.float32"}  # no MixedPrecision on the CPU: param dtype
    req = EstimateRequest(model="tiny", method="full", precision="fp32", gpus=2)
    terms = fsdp_terms(arch, req, 2, FITTED_MEMORY)
    shard_out = 4.0 / 2
    assert terms["gradient_buffers"] == pytest.approx(FSDP_GRAD_UNITS * block * (4.0 + shard_out))
    assert terms["root_gradients"] == root_params * 4.0
    # LoRA with peft's policy: the reduce-scatters carry adapter gradients only, never a block's
    lora = [n for n, _ in fsdp_run["lora"]["grads"]]
    lora_terms = fsdp_terms(arch, EstimateRequest(model="tiny", gpus=2), 2, FITTED_MEMORY)
    assert max(lora) < block and lora_terms["gradient_buffers"] == 0.0


def test_mixed_precision_reduce_copy_and_the_breakdown_show_the_buffers() -> None:
    """The runner's full fine-tune under FSDP (MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)): the
    unsharded bf16 gradient plus its fp32 copy and the fp32 shard it reduce-scatters into; the breakdown names
    the FSDP buffers and the estimate grows with them (vs the shards alone)."""
    from bot.planner.models import resolve

    arch = resolve("meta-llama/Llama-3.1-8B")[0]
    req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="full", gpus=2)  # mixed by default
    terms = fsdp_terms(arch, req, 2, FITTED_MEMORY)
    block = max(sum(lin.params for lin in g.linears) + g.other_params for g in arch.groups)
    assert terms["gradient_buffers"] == pytest.approx(FSDP_GRAD_UNITS * block * (2 + 4 + 4 / 2))
    assert terms["root"] == pytest.approx((arch.embedding_params + arch.global_other_params) * 2)
    assert terms["gathered"] == pytest.approx(4 * block * 2)
    mem = estimate_memory(arch, req)
    assert mem.breakdown["fsdp_buffers"] >= terms["root"] + terms["gathered"]
    lora_req = EstimateRequest(model="meta-llama/Llama-3.1-8B", method="lora", gpus=2)
    lora_terms = fsdp_terms(arch, lora_req, 2, FITTED_MEMORY)
    lora = estimate_memory(arch, lora_req)
    assert lora.breakdown["fsdp_buffers"] == pytest.approx(lora_terms["root"] + lora_terms["gathered"])


def test_qlora_under_fsdp_gathers_packed_bytes_and_replicates_the_quant_state() -> None:
    """bitsandbytes with bnb_4bit_quant_storage=bfloat16 (what FSDP needs to flatten it): the packed weight is
    0.5 B/param whatever the storage dtype, the quant state (absmax per 64, double-quantized) stays a module
    attribute on every GPU, and backward dequantizes each Linear to a bf16 weight (2 B/param)."""
    torch = pytest.importorskip("torch")
    bnb_f = pytest.importorskip("bitsandbytes.functional")
    from bot.planner.memory import NF4_DQ_BYTES, NF4_STORAGE_BYTES

    w = torch.randn(256, 512, dtype=torch.bfloat16)
    for storage in (torch.uint8, torch.bfloat16):
        packed, state = bnb_f.quantize_4bit(
            w, blocksize=64, quant_type="nf4", quant_storage=storage, compress_statistics=True
        )
        assert packed.dtype == storage
        assert packed.numel() * packed.element_size() == NF4_STORAGE_BYTES * w.numel()
        state_bytes = state.absmax.numel() * state.absmax.element_size() + 4 * state.state2.absmax.numel()
        assert state_bytes / w.numel() == pytest.approx(NF4_DQ_BYTES - NF4_STORAGE_BYTES, abs=1e-3)
        assert bnb_f.dequantize_4bit(packed, state).dtype == torch.bfloat16  # 2 B/param, per Linear
    from bot.planner.models import resolve

    arch = resolve("meta-llama/Llama-2-70b-hf")[0]
    req = EstimateRequest(model="meta-llama/Llama-2-70b-hf", method="qlora", gpus=2, qlora_upcast=False)
    terms = fsdp_terms(arch, req, 2, FITTED_MEMORY)
    assert terms["quant_state"] == pytest.approx((NF4_DQ_BYTES - 0.5) * arch.block_linear_params / 2)
    linear = max(sum(lin.params for lin in g.linears) for g in arch.groups)
    assert terms["gathered"] == pytest.approx(1 * (linear * 0.5 + 2 * (arch.hidden * 2)))  # one block
    torchtune = EstimateRequest(
        model="meta-llama/Llama-2-70b-hf", method="qlora", gpus=2, stack="torchtune", fsdp_version=2
    )
    assert fsdp_terms(arch, torchtune, 2, FITTED_MEMORY)["quant_state"] == 0.0  # NF4Tensor shards its scalers
