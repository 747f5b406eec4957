"""The host side of a step is counted, not fitted (issue 36 item 2): the ops the planner says a step
dispatches (bot/planner/speed.py) are the ops the runner's own step dispatches, counted here with a
TorchDispatchMode on tiny models of the same blocks (1 and 3 layers; LoRA on one, two or all Linears; a full
fine-tune; with and without checkpointing; a vocabulary the chunked loss cuts in several chunks). And the
host model holds where it matters: the only GPU measurements of the runner's step (an H200 at micro-batch 1)
and this machine's CPU fall within the quoted range."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bot.planner.architectures import from_config
from bot.planner.gpus import cpu_device, gpu
from bot.planner.models import resolve
from bot.planner.ranges import speed_range, speed_ratio
from bot.planner.request import EstimateRequest
from bot.planner.speed import estimate_speed, forward_ops, ops_per_micro_step, optimizer_ops

torch = pytest.importorskip("torch")


class _Counter:
    """Counts every aten op dispatched while active (what eager PyTorch launches, kernel by kernel)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                counter.n += 1
                return func(*args, **(kwargs or {}))

        self.n = 0
        self.mode = Mode()

    def __enter__(self) -> _Counter:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """make-tiny's model and data, and the same model with 1 and 3 layers and with a 65,536-entry
    vocabulary (the chunked loss's chunk is then 256 tokens)."""
    from transformers import AutoConfig, LlamaForCausalLM

    from runner.tiny import make_tiny

    root = tmp_path_factory.mktemp("host-ops")
    make_tiny(root / "tiny", seed=0)
    src = root / "tiny" / "model"
    out = {"2": src, "data": root / "tiny" / "data.jsonl"}
    for name, change in (
        ("1", {"num_hidden_layers": 1}),
        ("3", {"num_hidden_layers": 3}),
        ("v", {"vocab_size": 65536}),
    ):
        dst = root / name
        dst.mkdir()
        for f in src.iterdir():
            if f.name not in ("model.safetensors", "config.json"):
                shutil.copy(f, dst / f.name)
        config = AutoConfig.from_pretrained(src)
        for key, value in change.items():
            setattr(config, key, value)
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(dst)
        out[name] = dst
    return out


def _trainer(model: Path, data: Path, tmp: Path, **spec: Any) -> Any:
    from runner.contract.spec import JobSpec
    from runner.train import Preemption, Trainer

    job = {
        "job_id": "ops",
        "base_model": str(model),
        "dataset": {"uri": str(data), "format": "alpaca"},
        "checkpoint": {"uri": str(tmp / "ck")},
        "output_uri": str(tmp / "out"),
        "gpus": 0,
        "micro_batch_size": 1,
        "grad_accum": 1,
        "samples": {"count": 0},
        **spec,
    }
    trainer = Trainer(JobSpec.model_validate(job), Preemption())
    trainer.setup()
    return trainer


def _counted(trainer: Any) -> tuple[int, int, int]:
    """(forward + backward, the optimizer's update, an eval forward) of one micro-batch, counted."""
    from runner.train import MAX_GRAD_NORM

    batch = trainer.batches_for(trainer.data.train, 0)[0]
    inputs = dict(batch.items())
    labels = inputs.pop("labels")
    model = trainer.ddp_model

    def step() -> tuple[int, int]:
        model.train()
        with _Counter() as fb:
            trainer.head_loss(model, inputs, labels).backward()
        with _Counter() as opt:
            torch.nn.utils.clip_grad_norm_(trainer.params, MAX_GRAD_NORM)
            trainer.optimizer.step()
            trainer.scheduler.step()
            trainer.optimizer.zero_grad(set_to_none=True)
        return fb.n, opt.n

    step()  # the first step makes AdamW's states
    train, update = step()
    model.eval()
    with torch.no_grad(), _Counter() as ev:
        trainer.head_loss(model, inputs, labels)
    return train, update, ev.n


CASES = [
    ("1", "lora", "all-linear", True, 256),
    ("3", "lora", "all-linear", True, 256),
    ("3", "lora", ["q_proj"], True, 256),
    ("3", "lora", ["q_proj", "v_proj"], False, 256),
    ("1", "full", "all-linear", False, 256),
    ("3", "full", "all-linear", True, 256),
    ("v", "lora", "all-linear", True, 2048),
]


@pytest.mark.parametrize(("layers", "method", "targets", "ckpt", "seq"), CASES)
def test_the_planner_counts_the_ops_the_runners_step_dispatches(
    tiny_models: dict[str, Path], tmp_path: Path, layers: str, method: str, targets: Any, ckpt: bool, seq: int
) -> None:
    model = tiny_models[layers]
    trainer = _trainer(
        model,
        tiny_models["data"],
        tmp_path,
        method=method,
        lora={"r": 8, "target_modules": targets, "dropout": 0.0},
        gradient_checkpointing=ckpt,
        seq_len=seq,
    )
    counted_step, counted_update, counted_eval = _counted(trainer)
    config = json.loads((model / "config.json").read_text())
    arch = from_config(config)
    req = EstimateRequest(
        model=str(model),
        method=method,
        lora_r=8,
        lora_targets="all-linear" if targets == "all-linear" else [t.removesuffix("_proj") for t in targets],
        gradient_checkpointing=ckpt,
        seq_len=seq,
    )
    if method != "full":
        arch = arch.adapt(req.lora_targets)
    assert ops_per_micro_step(arch, req, device="cpu") == pytest.approx(counted_step, rel=0.01)
    assert optimizer_ops(arch, req) == pytest.approx(counted_update, rel=0.01)
    assert forward_ops(arch, req, device="cpu") == pytest.approx(counted_eval, rel=0.01)


# bench/gpu_check/README.md: the runner's step on one H200, Llama-3.2-1B's architecture, LoRA r=16 on all
# linear layers, micro-batch 1, checkpointing, the chunked loss (the loop before issue 37: no autocast, the
# QLoRA upcast).
H200_ROWS = [("lora", 1024, 5_336), ("lora", 4096, 17_148), ("qlora", 1024, 2_862), ("qlora", 4096, 4_873)]


@pytest.mark.parametrize(("method", "seq", "measured"), H200_ROWS)
def test_the_host_model_holds_on_the_h200_rows(method: str, seq: int, measured: float) -> None:
    """A 1B step at micro-batch 1 is the host's: ~11,000 ops at ~15 us whatever the sequence. On 9a0c9c1 three
    of the four rows ran below the bottom of the quoted range (LoRA 1,024: 18,654 quoted, 5,336 measured)."""
    arch, _ = resolve("meta-llama/Llama-3.2-1B")
    req = EstimateRequest(
        model="meta-llama/Llama-3.2-1B", method=method, seq_len=seq, autocast=False, qlora_upcast=True
    )
    arch = arch.adapt(req.lora_targets)
    quoted = estimate_speed(arch, req, gpu("h200")).tokens_per_second
    low, high = speed_range(quoted, speed_ratio(req))
    # Within the range, or (QLoRA's fp32 path, which issue 37 removed) within 2x of the quote.
    if method == "lora":
        assert low <= measured <= high, (quoted, low, high, measured)
    else:
        assert quoted / 2.2 <= measured <= high, (quoted, measured)


def test_a_cpu_shared_by_more_runs_than_cores_is_quoted_slower() -> None:
    """The local provider's CPU is priced for the share of its cores a run gets: four runs on two cores each
    take about twice as long as one, and the host's dispatch of each slows once runs outnumber cores."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    }
    arch = from_config(config).adapt("all-linear")
    req = EstimateRequest(model="tiny", seq_len=128, batch_size=2)
    alone = estimate_speed(arch, req, cpu_device(2, 1)).step_seconds
    two = estimate_speed(arch, req, cpu_device(2, 2)).step_seconds
    four = estimate_speed(arch, req, cpu_device(2, 4)).step_seconds
    assert alone < two < four
    assert four == pytest.approx(2 * two, rel=0.05)
