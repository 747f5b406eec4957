"""What makes a checkpoint folder a result people can load by itself, whatever happens to the run after it.

A checkpoint (runner/checkpoint.py) holds the trainable weights for an exact resume. Beside them this module
writes what transformers and peft need to load it without tunebot, so that a job stopped by its owner, by its
budget or by a failure still leaves a usable model:

- LoRA / QLoRA: ``adapter_model.safetensors`` + ``adapter_config.json`` through peft's ``save_pretrained``
  (the same tensors the checkpoint keeps; under FSDP, where peft's helper finds nothing in the rewrapped
  module tree, the LoRA tensors are taken by name from the gathered weights), so
  ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), CHECKPOINT)`` loads it;
- full fine-tuning: ``config.json`` (and ``generation_config.json``) beside ``model.safetensors``, so
  ``AutoModelForCausalLM.from_pretrained(CHECKPOINT)`` loads it;
- the tokenizer files in both cases.

The adapter's ``base_model_name_or_path`` names the Hub id people know (the runner's local folder otherwise).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def is_adapter(model: Any) -> bool:
    return hasattr(model, "peft_config")


def adapter_tensors(state: dict[str, Any], adapter_name: str) -> dict[str, Any]:
    """peft's file format from parameters named as the model has them (the adapter name dropped from the
    keys, as ``get_peft_model_state_dict`` does)."""
    return {
        k.replace(f".{adapter_name}.", "."): v.detach().cpu().contiguous()
        for k, v in state.items()
        if "lora_" in k and f".{adapter_name}." in k
    }


def add_loadable_files(
    folder: Path,
    model: Any,
    tokenizer: Any,
    *,
    trainable: dict[str, Any] | None = None,
    base_name: str | None = None,
) -> None:
    """Write the files that make ``folder`` loadable by transformers / peft on their own.

    ``trainable``: under FSDP, the trainable weights gathered by parameter name (peft's own helper cannot
    walk the wrapped model); None: the model is not wrapped and peft saves its adapter itself.
    """
    folder.mkdir(parents=True, exist_ok=True)
    if is_adapter(model):
        name = getattr(model, "active_adapter", None) or "default"
        if not isinstance(name, str):
            name = "default"
        if trainable is None:
            model.save_pretrained(str(folder), safe_serialization=True)
        else:
            from safetensors.torch import save_file

            save_file(adapter_tensors(trainable, name), str(folder / ADAPTER_FILE), metadata={"format": "pt"})
            model.peft_config[name].save_pretrained(str(folder))
        point_adapter_at(folder, base_name)
    else:
        model.config.save_pretrained(str(folder))
        generation = getattr(model, "generation_config", None)
        if generation is not None:
            try:
                generation.save_pretrained(str(folder))
            except Exception:  # a generation config transformers itself would refuse: not needed to load
                pass
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def point_adapter_at(folder: Path, base: str | None) -> None:
    """peft writes the local base folder into adapter_config.json; the name people load it by is better."""
    path = folder / ADAPTER_CONFIG
    if base is None or not path.is_file() or not re.fullmatch(r"[\w.\-]+/[\w.\-]+", base):
        return  # only a hub id is a name others can load the base by
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
