"""Two gloo worker processes on the CPU (gpus 0 + TUNEBOT_CPU_PROCESSES=2): LoRA under FSDP (what the planner
prices on several GPUs) lowers the loss, SIGTERM to the launcher reaches every worker, and the ranks agree
on one checkpoint that rank 0 writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.checkpoint import CheckpointStore
from runner.contract.spec import EXIT_PREEMPTED
from runner.distributed import processes_for


def test_processes_requested(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNEBOT_CPU_PROCESSES", raising=False)
    assert [processes_for(g) for g in (0, 1, 4)] == [1, 1, 4]
    monkeypatch.setenv("TUNEBOT_CPU_PROCESSES", "2")
    assert processes_for(0) == 2 and processes_for(1) == 1


@pytest.mark.slow
def test_two_cpu_processes_train_lora_sharded_and_save_one_checkpoint_on_sigterm(
    runner_job: Callable[..., Any], write_spec: Callable[..., Path], runner_process: Callable[..., Any]
) -> None:
    spec = runner_job(
        max_steps=30,
        seq_len=128,
        grad_accum=1,
        report={"every_seconds": 0.01},
        checkpoint={"every_minutes": 60},
    )
    proc = runner_process(write_spec(spec), env={"TUNEBOT_CPU_PROCESSES": "2"})
    rc, summary = proc.finish(sigterm_at_step=8)
    assert rc == EXIT_PREEMPTED and summary["status"] == "preempted", proc.stderr[-3000:]
    assert "processes 2" in "\n".join(proc.lines)  # the derived numbers count both workers
    assert "method lora, sharding fsdp" in "\n".join(proc.lines)  # sharded as priced, not DDP

    losses = [float(line.split("loss ")[1].split()[0]) for line in proc.lines if line.startswith("step ")]
    assert len(losses) >= 8
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.8, losses
    steps = CheckpointStore(spec.checkpoint.uri).complete_steps()
    assert steps == [summary["steps"]]  # one checkpoint, at the step both ranks stopped on
    ckpt = Path(spec.checkpoint.uri) / f"checkpoint-{steps[0]}"
    assert (ckpt / "rng_state_0.pth").exists() and (ckpt / "rng_state_1.pth").exists()
    assert (ckpt / "trainable.safetensors").exists()  # the adapters gathered from the FSDP shards
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # ... and the same checkpoint is a PEFT adapter people can load by itself
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(spec.base_model), str(ckpt))
    assert sum(1 for n, _ in model.named_parameters() if "lora_" in n) > 0
    assert sum(1 for line in proc.lines if line.startswith("{")) == 1  # only rank 0 prints the summary


@pytest.mark.slow
def test_full_fine_tuning_on_two_cpu_processes_shards_with_fsdp_and_saves_whole_weights(
    runner_job: Callable[..., Any], write_spec: Callable[..., Path], runner_process: Callable[..., Any]
) -> None:
    spec = runner_job(
        method="full",
        learning_rate=3e-3,
        max_steps=6,
        seq_len=128,
        grad_accum=1,
        report={"every_seconds": 0.01},
        checkpoint={"every_minutes": 1e-9, "keep": 1},
    )
    proc = runner_process(write_spec(spec), env={"TUNEBOT_CPU_PROCESSES": "2"})
    rc, summary = proc.finish()
    assert rc == 0 and summary["status"] == "finished" and summary["steps"] == 6, proc.stderr[-3000:]
    losses = [float(line.split("loss ")[1].split()[0]) for line in proc.lines if line.startswith("step ")]
    assert losses[-1] < losses[0] - 0.5, losses

    (step,) = CheckpointStore(spec.checkpoint.uri).complete_steps()
    ckpt = Path(spec.checkpoint.uri) / f"checkpoint-{step}"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "config.json").exists()
    from transformers import AutoModelForCausalLM

    # the checkpoint is itself a whole model transformers loads
    from_checkpoint = AutoModelForCausalLM.from_pretrained(str(ckpt))
    assert sum(p.numel() for p in from_checkpoint.parameters()) == sum(
        p.numel() for p in AutoModelForCausalLM.from_pretrained(spec.base_model).parameters()
    )

    # The gathered (unsharded) weights: a loadable model with every parameter, not one rank's shard.
    trained = AutoModelForCausalLM.from_pretrained(spec.output_uri)
    base = AutoModelForCausalLM.from_pretrained(spec.base_model)
    assert sum(p.numel() for p in trained.parameters()) == sum(p.numel() for p in base.parameters())
    changed = [
        n
        for (n, a), (_, b) in zip(trained.named_parameters(), base.named_parameters(), strict=True)
        if not a.detach().equal(b.detach())
    ]
    assert len(changed) == len(list(base.parameters()))


@pytest.mark.slow
def test_lora_under_fsdp_finishes_with_an_adapter_peft_loads(
    runner_job: Callable[..., Any], write_spec: Callable[..., Path], runner_process: Callable[..., Any]
) -> None:
    spec = runner_job(
        max_steps=4,
        seq_len=128,
        grad_accum=1,
        lora={"target_modules": ["q_proj", "v_proj"]},
        checkpoint={"every_minutes": 60},
    )
    proc = runner_process(write_spec(spec), env={"TUNEBOT_CPU_PROCESSES": "2"})
    rc, summary = proc.finish()
    assert rc == 0 and summary["status"] == "finished", proc.stderr[-3000:]
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter = load_file(str(Path(spec.output_uri) / "adapter_model.safetensors"))
    assert adapter and all("lora_" in name for name in adapter)
    assert {n.split(".")[-3] for n in adapter} == {"q_proj", "v_proj"}  # every adapted layer, gathered
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(spec.base_model), spec.output_uri)
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) == sum(
        t.numel() for t in adapter.values()
    )


@pytest.mark.slow
def test_two_processes_measure_before_and_after_and_answer_side_by_side(
    runner_job: Callable[..., Any], write_spec: Callable[..., Path], runner_process: Callable[..., Any]
) -> None:
    """Under FSDP every rank takes part in the base model's eval and in each generated token; the result is
    the last step there (keep=best needs one process), and the card says so."""
    import json

    spec = runner_job(
        max_steps=4,
        seq_len=128,
        grad_accum=1,
        dataset={"eval_fraction": 0.05},
        plateau={"enabled": False, "every_steps": 2},
        samples={"count": 1, "max_new_tokens": 4},
        checkpoint={"every_minutes": 60},
    )
    proc = runner_process(write_spec(spec), env={"TUNEBOT_CPU_PROCESSES": "2"})
    rc, summary = proc.finish()
    assert rc == 0 and summary["status"] == "finished", proc.stderr[-3000:]
    evals = [line for line in proc.lines if line.startswith("eval loss ")]
    assert len(evals) == 3 and "(the base model, before training)" in evals[0]  # steps 0, 2, 4
    results = json.loads((Path(spec.output_uri) / "training_summary.json").read_text())["results"]
    assert results["keep"] == "last" and results["result_step"] == 4 and len(results["samples"]) == 1
    assert "keep=best needs a single process" in results["why"]
