"""The runner image (no Docker engine here, so the Dockerfile is checked as text)."""

from __future__ import annotations

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_cuda_pytorch_base_runner_extra_non_root_and_entrypoint() -> None:
    steps = _instructions()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert len(froms) == 1 and froms[0].startswith("pytorch/pytorch:") and "cuda" in froms[0]
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    assert "pip install" in runs and ('".[runner]"' in runs or " .[runner]" in runs)
    # The base image's CUDA torch is pinned while the extras resolve, so pip cannot swap it for another build.
    assert "-c /tmp/torch-constraint.txt" in runs and "torch.__version__" in runs
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert [i for i, (w, _) in enumerate(steps) if w == "USER"][-1] > [
        i for i, (w, _) in enumerate(steps) if w == "RUN"
    ][-1]  # nothing runs as root after the switch
    entry = [rest for word, rest in steps if word == "ENTRYPOINT"]
    assert entry and shlex.split(entry[-1].strip("[]").replace(",", " ")) == ["tunebot-runner"]
    copied = " ".join(rest for word, rest in steps if word == "COPY")
    assert "pyproject.toml" in copied and "runner" in copied


def test_the_build_context_leaves_out_the_venv_and_git() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_a_container_started_without_a_spec_fails_instead_of_printing_help() -> None:
    # Clouds start the image with the spec in TUNEBOT_JOB_SPEC and no args: a CMD of `--help` made a
    # container that printed the usage and exited 0 as if it had trained.
    steps = _instructions()
    assert not [rest for word, rest in steps if word == "CMD"]
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "runner.cli"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and "no job spec" in done.stderr


def test_the_default_needs_no_image_of_ours_and_the_prebuilt_one_is_named_alike() -> None:
    """Unset, TUNEBOT_RUNNER_IMAGE leaves hosts on the public stock PyTorch image the Dockerfile builds on
    (the runner is installed at start: bot/engine/launching/runner_bundle.py); a team's prebuilt image is the
    option the cloud quick start (docs/cloud.md), the build script and the Dockerfile name the same way."""
    from bot.settings import RUNNER_IMAGE_REPO, STOCK_IMAGE, Settings, prebuilt_runner_image

    assert Settings().runner_image is None and Settings().stock_image == STOCK_IMAGE
    assert f"FROM {STOCK_IMAGE}" in (ROOT / "Dockerfile").read_text()
    image = prebuilt_runner_image()
    version = image.rsplit(":", 1)[1]
    assert image == f"{RUNNER_IMAGE_REPO}:{version}" and version == _project_version()
    readme = (ROOT / "docs" / "cloud.md").read_text()  # the README's cloud quick start
    assert RUNNER_IMAGE_REPO in readme and "TUNEBOT_RUNNER_IMAGE" in readme and "docker push" in readme
    assert "TUNEBOT_STOCK_IMAGE" in readme
    script = (ROOT / "scripts" / "runner-image.sh").read_text()
    assert f"{RUNNER_IMAGE_REPO}:${{version}}" in script and "docker push" in script
    assert RUNNER_IMAGE_REPO in (ROOT / "Dockerfile").read_text()


def test_flash_attention_is_an_explicit_build_choice() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG FLASH_ATTN=0" in text and 'if [ "$FLASH_ATTN" = "1" ]' in text and "flash-attn" in text


def test_adamw_is_the_fused_kernel_on_cuda() -> None:
    """The planner assumes a fused optimizer step (no full-size temporaries); torch's fused AdamW it is."""
    import types

    import torch

    from runner.train import Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.spec = types.SimpleNamespace(
        optimizer="adamw", optimizer_impl="fused", learning_rate=1e-3, weight_decay=0.0
    )
    trainer.params = [torch.nn.Parameter(torch.zeros(4))]
    trainer.group = types.SimpleNamespace(device=torch.device("cpu"), main=True)
    assert not trainer._optimizer().defaults.get("fused")
    trainer.group = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"), main=True)
    assert trainer._optimizer().defaults["fused"] is True  # (torch's fused kernel also runs on the CPU)


def _project_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
