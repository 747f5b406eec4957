"""Full fine-tuning defaults: mixed precision (fp32 master weights, grads and AdamW states, bf16 compute under
autocast) at a full fine-tune's learning rate, priced with the bytes per parameter the runner allocates; risky
overrides are said on the card."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes.snapshot_plan import snapshot_plan

from bot.chat.blockkit import to_blocks
from bot.chat.cards import estimate_reply
from bot.engine.launching.jobspec import spec_fields
from bot.planner.architectures import from_config
from bot.planner.memory import estimate_memory
from bot.planner.request import EstimateRequest
from runner.contract.spec import Defaults, JobSpec
from runner.model import uses_autocast, weights_dtype

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


def _spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": "p",
            "base_model": "m",
            "dataset": {"uri": "d.jsonl"},
            "checkpoint": {"uri": "c"},
            "output_uri": "o",
            **fields,
        }
    )


def test_a_full_fine_tune_defaults_to_fp32_master_weights_and_a_full_ft_rate() -> None:
    full = _spec(method="full")
    assert (full.learning_rate, full.resolved_precision) == (Defaults.full_learning_rate, "mixed")
    assert Defaults.full_learning_rate == 2e-5
    assert weights_dtype(full, CUDA) == torch.float32 and uses_autocast(full, CUDA)
    pure = _spec(method="full", precision="bf16", learning_rate=1e-4)
    assert pure.learning_rate == 1e-4
    assert weights_dtype(pure, CUDA) == torch.bfloat16 and not uses_autocast(pure, CUDA)
    lora = _spec(method="lora")
    assert lora.learning_rate == 2e-4
    # issue 37: adapters compute in bf16 under autocast on CUDA too (fp32 only for their master weights)
    assert weights_dtype(lora, CUDA) == torch.bfloat16 and uses_autocast(lora, CUDA)
    assert weights_dtype(full, CPU) == torch.float32 and not uses_autocast(full, CPU)  # CPU: all fp32


def test_the_estimate_hands_the_runner_what_it_priced() -> None:
    # checkpointing and the chunked loss pinned: the peak is then the end of backward (without them, as a big
    # card may be chosen for, the peak comes before most gradients exist: bot/planner/batch_choice.py)
    req = EstimateRequest(
        model="llama-3.2-1b", method="full", tokens=1_000_000, loss="chunked", gradient_checkpointing=True
    )
    est = snapshot_plan(req)
    assert est.training is not None
    assert (est.training.precision, est.training.learning_rate) == ("mixed", 2e-5)
    spec = _spec(**{k: v for k, v in spec_fields(est.training).items() if k not in ("dataset",)})
    assert (spec.resolved_precision, spec.learning_rate) == ("mixed", 2e-5)
    n = est.model.parameters
    b = est.memory.breakdown_gb  # the peak is the end of backward: every fp32 gradient alive
    assert [round(b[k] * 1e9 / n, 2) for k in ("weights", "gradients", "optimizer")] == [4.0, 4.0, 8.0]
    pure = snapshot_plan(
        EstimateRequest(model="llama-3.2-1b", method="full", tokens=1_000_000, precision="bf16")
    )
    b = pure.memory.breakdown_gb  # what a9605e4 priced by default: 2 + 4 B/param besides the gradients
    assert [round(b[k] * 1e9 / n, 2) for k in ("weights", "optimizer")] == [2.0, 4.0]


def test_risky_overrides_are_warned_on_the_card_and_defaults_are_not() -> None:
    default = snapshot_plan(EstimateRequest(model="llama-3.2-1b", method="full", tokens=1_000_000))
    assert default.warnings == []
    risky = snapshot_plan(
        EstimateRequest(
            model="llama-3.2-1b", method="full", tokens=1_000_000, learning_rate=2e-4, precision="bf16"
        )
    )
    assert len(risky.warnings) == 2
    assert "0.0002 is a LoRA rate" in risky.warnings[0] and "pure bf16" in risky.warnings[1]
    blocks = str(to_blocks(estimate_reply(risky, estimate_id=None)))
    assert ":warning: learning rate 0.0002 is a LoRA rate" in blocks and ":warning: pure bf16" in blocks
    lora = snapshot_plan(EstimateRequest(model="llama-3.2-1b", tokens=1_000_000, learning_rate=2e-4))
    assert lora.warnings == []


@pytest.mark.slow
def test_the_bytes_per_parameter_priced_are_the_ones_the_runner_allocates(
    runner_job: Callable[..., Any],
) -> None:
    """The runner's full fine-tune holds fp32 weights, fp32 gradients and two fp32 AdamW states per parameter
    (on a GPU the same: mixed precision keeps fp32 masters); the planner's breakdown says the same bytes."""
    from runner.train import Preemption, Trainer

    spec = runner_job(method="full", max_steps=1)
    trainer = Trainer(spec, Preemption())
    try:
        trainer.setup()
        micro = [trainer.batches_for(trainer.data.train, 0)[i] for i in range(spec.grad_accum)]
        grads: list[int] = []
        hook = [
            p.register_post_accumulate_grad_hook(lambda p: grads.append(p.grad.element_size()))
            for p in trainer.params
        ]
        trainer._step(micro)
        for h in hook:
            h.remove()
        params = sum(p.numel() for p in trainer.params)
        weight_bytes = sum(p.numel() * p.element_size() for p in trainer.params)
        state_bytes = sum(
            t.numel() * t.element_size()
            for s in trainer.optimizer.state.values()
            for k, t in s.items()
            if k in ("exp_avg", "exp_avg_sq")
        )
    finally:
        trainer.close()
    config = Path(spec.base_model) / "config.json"
    arch = from_config(__import__("json").loads(config.read_text()), str(config))
    mem = estimate_memory(arch, EstimateRequest(model=str(config), method="full", seq_len=spec.seq_len))
    priced = {k: mem.breakdown[k] / arch.parameters for k in ("weights", "optimizer")}
    assert params == arch.parameters
    assert weight_bytes / params == priced["weights"] == 4.0
    assert state_bytes / params == priced["optimizer"] == 8.0
    assert set(grads) == {4}  # gradients in the weights' dtype: fp32, as priced (4 B/param at the peak)


# --- issue 37: bf16 compute on CUDA, reproduced on the CPU -------------------------------------------------


def _dtypes_at_attention_and_head(model: Any, context: Any, batch: dict[str, Any]) -> dict[str, set]:
    """The dtypes that reach scaled_dot_product_attention (query, key, value) and the lm_head matmul in one
    training forward and backward of the runner's loss, recorded per op as dispatched."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from runner.data.batching import model_inputs
    from runner.loss import HeadLoss, output_head

    head_shape = tuple(output_head(model).weight.shape)
    seen: dict[str, set] = {"attention": set(), "lm_head": set()}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            name = func.overloadpacket.__name__
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if "scaled_dot_product" in name and "backward" not in name:
                seen["attention"] |= {t.dtype for t in tensors[:3]}
            if name in ("mm", "addmm", "matmul", "linear") and any(
                tuple(t.shape) in (head_shape, head_shape[::-1]) for t in tensors
            ):
                seen["lm_head"] |= {t.dtype for t in tensors}
            return func(*args, **(kwargs or {}))

    inputs, labels, index = model_inputs(batch, "cpu")
    head = HeadLoss(model, "chunked", model.config)
    model.train()
    with Record():
        with context:
            loss = head(model, inputs, labels, index)
        loss.backward()
    head.remove()
    return seen


def _first_batch(spec: JobSpec) -> dict[str, Any]:
    from runner.contract.records import read_records
    from runner.data import make_batches, prepare
    from runner.model import load_tokenizer

    tokenizer = load_tokenizer(Path(spec.base_model))
    data = prepare(spec, tokenizer, records=list(read_records(spec.dataset.uri, spec.dataset.format)))
    batches = make_batches(
        # 3 rows: no activation of [rows x seq_len, hidden] has the lm_head weight's shape [vocab, hidden]
        data.train,
        seq_len=spec.seq_len,
        micro_batch_size=3,
        packing=True,
        attn="sdpa",
        seed=0,
        epoch=0,
    )
    return batches[0]


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_on_cuda_attention_and_the_lm_head_compute_in_bf16(
    method: str, runner_job: Callable[..., Any]
) -> None:
    """Issue 37: the runner's CUDA settings (runner/model.precision_for(spec, "cuda"): bf16 base, no fp32
    upcast of QLoRA's embeddings/norms/lm_head, adapters' inputs not copied to fp32, the forward under bf16
    autocast) reproduced on the CPU with CPU autocast: q/k/v reach attention in bf16 and the lm_head matmul
    runs in bf16; the adapters' master weights stay fp32."""
    from runner.model import load_model, precision_for

    spec = runner_job(method=method, gpus=0)
    plan = precision_for(spec, "cuda")
    assert (plan.weights, plan.compute, plan.autocast, plan.tf32) == (
        torch.bfloat16,
        torch.bfloat16,
        True,
        True,
    )
    model = load_model(spec, Path(spec.base_model), CPU, precision=plan)
    seen = _dtypes_at_attention_and_head(model, plan.context("cpu"), _first_batch(spec))
    assert seen["attention"] == {torch.bfloat16}
    assert seen["lm_head"] == {torch.bfloat16}
    trainable = {p.dtype for p in model.parameters() if p.requires_grad}
    assert trainable == {torch.float32}  # the adapters' master weights


def test_the_9a0c9c1_qlora_preparation_computed_attention_in_fp32(runner_job: Callable[..., Any]) -> None:
    """Control: QLoRA as 9a0c9c1 prepared it on CUDA (peft's prepare_model_for_kbit_training upcast, no
    autocast: runner/model.uses_autocast was False for adapters) gives fp32 at attention and the lm_head,
    which the measurement above sees."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    spec = runner_job(method="qlora", gpus=0)
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    model = AutoModelForCausalLM.from_pretrained(
        spec.base_model, dtype=torch.bfloat16, quantization_config=quant, device_map={"": CPU}
    )
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    import contextlib

    seen = _dtypes_at_attention_and_head(model, contextlib.nullcontext(), _first_batch(spec))
    assert torch.float32 in seen["attention"] and seen["lm_head"] == {torch.float32}


def test_cpu_runs_keep_fp32_without_autocast() -> None:
    """The local provider's CPU runs are as before: fp32 weights and compute, no autocast, no TF32."""
    from runner.model import precision_for

    for method in ("full", "lora", "qlora"):
        plan = precision_for(_spec(method=method), "cpu")
        assert (plan.weights, plan.compute, plan.autocast, plan.name) == (
            torch.float32,
            torch.float32,
            False,
            "fp32",
        )
