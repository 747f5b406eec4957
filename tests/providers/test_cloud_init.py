"""A VM's start script (Lambda, TensorDock): Docker, the NVIDIA container toolkit, then the runner.

TensorDock's plain ``ubuntu2404`` has no NVIDIA container toolkit, and ``docker run --gpus all`` fails there
without it. The steps are run here for real, in ``sh``, against stand-ins for curl, gpg, apt-get, Docker,
nvidia-ctk and systemctl that record what they were asked, on a PATH holding nothing else.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fakes.clouds import FakeTensorDock
from fakes.clouds.fixtures import client_for

from bot.providers.base import LaunchRequest, OfferQuery
from bot.providers.cloud_init import docker_run, runcmd, toolkit_steps

SHIMS = {
    # curl: the Docker install script creates `docker`; NVIDIA's key and apt list as their servers answer
    "curl": """#!/bin/sh
echo "curl $*" >> "$LOG"
case "$*" in
  *get.docker.com*)
    printf '%s\\n' "printf '#!/bin/sh\\necho \\"docker \\$*\\" >> \\"\\$LOG\\"\\n' > $SHIMS/docker" \\
      "chmod +x $SHIMS/docker" ;;
  *gpgkey*) echo "-----BEGIN PGP PUBLIC KEY BLOCK-----" ;;
  *nvidia-container-toolkit.list*)
    echo 'deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /' ;;
esac
""",
    "gpg": """#!/bin/sh
echo "gpg $*" >> "$LOG"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
cat > "$out"
""",
    # apt-get install of the toolkit puts nvidia-ctk on the PATH
    "apt-get": """#!/bin/sh
echo "apt-get $*" >> "$LOG"
case "$*" in
  *"install -y nvidia-container-toolkit"*)
    printf '#!/bin/sh\\necho "nvidia-ctk $*" >> "$LOG"\\n' > "$SHIMS/nvidia-ctk"
    chmod +x "$SHIMS/nvidia-ctk" ;;
esac
""",
    "systemctl": '#!/bin/sh\necho "systemctl $*" >> "$LOG"\n',
}


def run_steps(steps: list[str], tmp_path: Path) -> list[str]:
    """Run each step as cloud-init's runcmd does (one shell line each); the calls the stand-ins saw."""
    shims, tools = tmp_path / "shims", tmp_path / "tools"
    shims.mkdir(exist_ok=True)
    tools.mkdir(exist_ok=True)
    for name, body in SHIMS.items():
        (shims / name).write_text(body)
        (shims / name).chmod(0o755)
    for tool in ("sh", "cat", "sed", "chmod", "printf"):  # nothing else: no real docker or nvidia-ctk
        found = shutil.which(tool)
        if found and not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    env = {"PATH": f"{shims}:{tools}", "LOG": str(log), "SHIMS": str(shims)}
    for step in steps:
        done = subprocess.run([str(tools / "sh"), "-c", step], env=env, capture_output=True, text=True)
        assert done.returncode == 0, (step, done.stderr)
    return log.read_text().splitlines() if log.exists() else []


def test_a_bare_vm_gets_docker_and_the_nvidia_toolkit_before_the_runner_starts_on_the_gpus(
    tmp_path: Path,
) -> None:
    keyring, sources = tmp_path / "keyring.gpg", tmp_path / "toolkit.list"
    toolkit = toolkit_steps(keyring=str(keyring), sources=str(sources))
    steps = [runcmd("img:1")[0], *toolkit, docker_run("img:1")]
    calls = run_steps(steps, tmp_path)

    def at(prefix: str) -> int:  # the call's position (pipelines run at once: curl and gpg in either order)
        return next(i for i, c in enumerate(calls) if c.startswith(prefix))

    assert len(calls) == 9, calls
    assert at("curl -fsSL https://get.docker.com") < at("curl -fsSL https://nvidia.github.io")
    assert max(at("gpg --batch"), at("curl -fsSL https://nvidia.github.io")) < at("apt-get")
    assert calls[-5:] == [
        "apt-get -o DPkg::Lock::Timeout=600 update",
        "apt-get -o DPkg::Lock::Timeout=600 install -y nvidia-container-toolkit",
        "nvidia-ctk runtime configure --runtime=docker",
        "systemctl restart docker",
        calls[-1],
    ]
    assert calls[-1].startswith("docker run") and "--gpus all" in calls[-1] and calls[-1].endswith("img:1")
    assert sources.read_text().startswith(f"deb [signed-by={keyring}] https://nvidia.github.io/")
    assert keyring.read_text().startswith("-----BEGIN PGP")
    # On an image that has both (Lambda Stack): nothing installed, the runtime still registered.
    again = run_steps(steps, tmp_path)
    assert [c for c in again if c.startswith(("curl", "apt-get", "gpg"))] == []
    assert again == [
        "nvidia-ctk runtime configure --runtime=docker",
        "systemctl restart docker",
        calls[-1],
    ]


def test_tensordock_create_carries_the_toolkit_steps_before_docker_run() -> None:
    with FakeTensorDock(n_offers=10, seed=1).start() as fake:
        provider = client_for(fake)
        offer = provider.search_offers(OfferQuery())[0]
        provider.launch(LaunchRequest(job_id="gpu", offer=offer, image="img:3", env={"K": "v"}))
        steps = fake.last_body("create")["data"]["attributes"]["cloud_init"]["runcmd"]
    assert steps == runcmd("img:3")
    at = {s: i for i, s in enumerate(steps)}
    install = next(i for i, s in enumerate(steps) if "install -y nvidia-container-toolkit" in s)
    assert install < at["nvidia-ctk runtime configure --runtime=docker"] < at["systemctl restart docker"]
    assert at["systemctl restart docker"] < len(steps) - 1 and "--gpus all" in steps[-1]


@pytest.mark.parametrize("step", runcmd("img:1"))
def test_every_step_is_valid_shell(step: str, tmp_path: Path) -> None:
    assert subprocess.run(["sh", "-n", "-c", step], capture_output=True).returncode == 0
