"""What the runner downloads of a Hub model: one 16-bit copy of the weights, the disk it was sized for."""

from __future__ import annotations


def test_the_runner_downloads_one_copy_of_the_weights_the_disk_was_sized_for() -> None:
    """meta-llama/Llama-3.1-70B keeps its original/ checkpoints (another 141 GB) beside the safetensors; the
    runner fetched the whole repository on a9605e4."""
    from huggingface_hub.utils import filter_repo_objects

    from runner.model import ignored_weight_files

    files = [
        "config.json",
        "tokenizer.json",
        "model-00001-of-00030.safetensors",
        "model.safetensors.index.json",
        "original/consolidated.00.pth",
        "original/params.json",
        "pytorch_model-00001-of-00002.bin",
        "flax_model.msgpack",
        "generation_config.json",
    ]
    kept = list(filter_repo_objects(files, ignore_patterns=ignored_weight_files(files)))
    assert kept == [
        "config.json",
        "tokenizer.json",
        "model-00001-of-00030.safetensors",
        "model.safetensors.index.json",
        "generation_config.json",
    ]
    only_bin = ["config.json", "pytorch_model.bin"]
    assert list(filter_repo_objects(only_bin, ignore_patterns=ignored_weight_files(only_bin))) == only_bin
