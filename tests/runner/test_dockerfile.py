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
        i for i, (w, _) in enumerate(steps) if w == "RUN"][-1]  # nothing runs as root after the switch
    entry = [rest for word, rest in steps if word == "ENTRYPOINT"]
    assert entry and shlex.split(entry[-1].strip("[]").replace(",", " ")) == ["tunebot-runner"]
    copied = " ".join(rest for word, rest in steps if word == "COPY")
    assert "pyproject.toml" in copied and "runner" in copied


def test_the_build_context_leaves_out_the_venv_and_git() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
