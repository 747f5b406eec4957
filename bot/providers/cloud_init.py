"""Start the runner container on a VM (Lambda, TensorDock) with cloud-init.

The environment (JobSpec JSON, HF token, ...) is written to a root-only env file and handed to
``docker run --env-file``, so secrets never appear on a command line or in ``ps``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

ENV_FILE = "/etc/tunebot/runner.env"
CONTAINER_NAME = "tunebot-runner"


def env_file_content(env: Mapping[str, str]) -> str:
    """docker --env-file format: one KEY=VALUE per line, no quoting (values must be single-line)."""
    lines = []
    for key, value in env.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"environment variable {key} spans lines; docker --env-file cannot carry it")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def docker_run(image: str, command: Sequence[str] | None = None, *, gpus: bool = True) -> str:
    parts = [
        "docker",
        "run",
        "--detach",
        "--name",
        CONTAINER_NAME,
        "--restart",
        "no",
        "--env-file",
        ENV_FILE,
        "--shm-size",
        "16g",
    ]
    if gpus:
        parts += ["--gpus", "all"]
    parts.append(image)
    parts += list(command or [])
    return shlex.join(parts)


def runcmd(image: str, command: Sequence[str] | None = None) -> list[str]:
    """The shell steps: ensure docker exists (TensorDock's plain Ubuntu image), then run the runner."""
    return [
        "command -v docker >/dev/null 2>&1 || (curl -fsSL https://get.docker.com | sh)",
        docker_run(image, command),
    ]


def user_data(image: str, env: Mapping[str, str], command: Sequence[str] | None = None) -> str:
    """A ``#cloud-config`` document (Lambda ``user_data``). JSON strings are valid YAML scalars."""
    content = env_file_content(env)
    lines = [
        "#cloud-config",
        "write_files:",
        f"  - path: {ENV_FILE}",
        "    permissions: '0600'",
        "    owner: root:root",
        f"    content: {json.dumps(content)}",
        "runcmd:",
    ]
    lines += [f"  - {json.dumps(step)}" for step in runcmd(image, command)]
    return "\n".join(lines) + "\n"


def cloud_init_dict(image: str, env: Mapping[str, str], command: Sequence[str] | None = None) -> dict:
    """The same as a structured object (TensorDock's ``cloud_init`` field)."""
    return {
        "write_files": [
            {"path": ENV_FILE, "permissions": "0600", "owner": "root:root", "content": env_file_content(env)}
        ],
        "runcmd": runcmd(image, command),
    }
