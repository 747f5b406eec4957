"""Every checkpoint is a result people can load without tunebot: a LoRA checkpoint is a PEFT adapter
(adapter_config.json + adapter_model.safetensors, PeftModel.from_pretrained on the base), a full fine-tune's
is a model (AutoModelForCausalLM.from_pretrained). A job stopped by its owner, its budget or a failure has
only its checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.checkpoint import CheckpointStore
from runner.contract.spec import EXIT_OK
from runner.train import run


def _newest(spec: Any) -> Path:
    store = CheckpointStore(spec.checkpoint.uri)
    step = store.newest_complete()
    assert step is not None, "no complete checkpoint"
    return Path(store.uri_of(step))


@pytest.mark.slow
def test_lora_checkpoint_is_a_peft_adapter_that_loads_on_the_base(runner_job: Callable[..., Any]) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    spec = runner_job(
        max_steps=4,
        seq_len=128,
        learning_rate=1e-2,
        # no warm-up: on a loaded machine the newest complete checkpoint can be step 1's (a timed save waits
        # while the last one uploads, and a finished run's last step is its output, not a checkpoint), and a
        # warm-up's first step trains at a learning rate of 0 (the adapter's B still zero: nothing changes)
        warmup_ratio=0.0,
        lora={"target_modules": ["q_proj", "v_proj"]},
        checkpoint={"every_minutes": 1e-9, "keep": 1},
        base_model_name="acme/tiny-llama",
    )
    summary, code = run(spec)
    assert code == EXIT_OK, summary
    ckpt = _newest(spec)
    assert (ckpt / "adapter_config.json").is_file() and (ckpt / "adapter_model.safetensors").is_file()
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == spec.lora.r
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == "acme/tiny-llama"  # the name people load the base by

    base = AutoModelForCausalLM.from_pretrained(spec.base_model)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    with torch.no_grad():
        before = base(ids).logits.clone()
    model = PeftModel.from_pretrained(base, str(ckpt))
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert len(loaded) == len(saved) == 2 * 2 * 2  # q and v, A and B, in both layers
    for name, tensor in saved.items():
        assert torch.equal(loaded[name.replace(".weight", ".default.weight")].detach(), tensor), name
    with torch.no_grad():
        after = model(ids).logits
    assert not torch.allclose(before, after)  # the trained adapter changes what the model says
    # the tokenizer is there too: the folder is a result on its own
    assert (ckpt / "tokenizer_config.json").is_file()


@pytest.mark.slow
def test_full_checkpoint_is_a_model_transformers_loads(runner_job: Callable[..., Any]) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    spec = runner_job(
        method="full",
        max_steps=3,
        seq_len=128,
        learning_rate=3e-3,
        checkpoint={"every_minutes": 1e-9, "keep": 1},
    )
    summary, code = run(spec)
    assert code == EXIT_OK, summary
    ckpt = _newest(spec)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    saved = load_file(str(ckpt / "model.safetensors"))
    params = dict(model.named_parameters())
    assert saved and all(torch.equal(params[n].detach(), t) for n, t in saved.items())
    base = AutoModelForCausalLM.from_pretrained(spec.base_model)
    assert any(not torch.equal(p.detach(), params[n].detach()) for n, p in base.named_parameters())
