"""Start the runner container on a VM (Lambda, TensorDock) with cloud-init.

The environment (JobSpec JSON, HF token, ...) is written to a root-only env file and handed to
``docker run --env-file``, so secrets never appear on a command line or in ``ps``.

A plain Ubuntu VM (TensorDock's ``ubuntu2404``) has neither Docker nor the NVIDIA container toolkit, and
``docker run --gpus all`` fails without the toolkit ("could not select device driver"): the steps install
Docker where it is missing, the toolkit from NVIDIA's apt repository where ``nvidia-ctk`` is missing
(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html), register
its runtime with Docker (``nvidia-ctk runtime configure --runtime=docker``) and restart Docker, then run
the runner with ``--gpus all``. On an image that has both (Lambda Stack) the installs are skipped.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence

ENV_FILE = "/etc/tunebot/runner.env"
CONTAINER_NAME = "tunebot-runner"
TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container"
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
TOOLKIT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
APT = "apt-get -o DPkg::Lock::Timeout=600"  # a fresh VM's unattended upgrades may hold the dpkg lock


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


def toolkit_steps(*, keyring: str = TOOLKIT_KEYRING, sources: str = TOOLKIT_LIST) -> list[str]:
    """Install the NVIDIA container toolkit where it is missing, register it with Docker, restart Docker."""
    signed = f"deb [signed-by={keyring}] https://"
    install = (
        f"curl -fsSL {TOOLKIT_REPO}/gpgkey | gpg --batch --yes --dearmor -o {shlex.quote(keyring)}"
        f" && curl -fsSL {TOOLKIT_REPO}/stable/deb/nvidia-container-toolkit.list"
        f" | sed {shlex.quote(f's#deb https://#{signed}#g')} > {shlex.quote(sources)}"
        f" && {APT} update && {APT} install -y nvidia-container-toolkit"
    )
    return [
        f"command -v nvidia-ctk >/dev/null 2>&1 || ({install})",
        "nvidia-ctk runtime configure --runtime=docker",
        "systemctl restart docker",
    ]


def runcmd(image: str, command: Sequence[str] | None = None) -> list[str]:
    """The shell steps: Docker and the NVIDIA container toolkit where missing, then the runner on the GPUs."""
    return [
        "command -v docker >/dev/null 2>&1 || (curl -fsSL https://get.docker.com | sh)",
        *toolkit_steps(),
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
