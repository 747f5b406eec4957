"""Start the runner on a stock PyTorch image: nothing of ours is published anywhere.

The bot stages the runner in the job's storage prefix (bot/engine/launching/runner_bundle.py): a wheel built
from this package and a constraints file pinning the libraries it trains with. The create call carries this
program (base64 in TUNEBOT_BOOTSTRAP, so no quoting survives a cloud's command field) and
TUNEBOT_RUNNER_BUNDLE: where to fetch both (presigned URLs), their sizes and SHA-256. On the host it

1. fetches the wheel and the constraints file, and refuses either unless its SHA-256 is the one in the create
   call (whoever can write the job's storage prefix, an earlier run's host included, cannot swap the code);
2. pip-installs the wheel next to the image's torch: the constraints pin the libraries, and torch is pinned
   to the version the image already has, so pip never downloads another torch (or another CUDA build);
3. pip-installs the optional speed-ups the bundle names (liger-kernel), each on its own: one that does not
   install leaves a line and the run goes on without it;
4. replaces itself with `tunebot-runner` (the spec and secrets are already in the environment).

Standard library only: it runs before anything of ours is installed. A failure prints one line starting with
"tunebot: cannot start the runner:" and exits EXIT_INSTALL (78): the bot retries once on another host, then
fails the job saying so (bot/engine/watching/supervise.py). Run it by hand with the same environment to see
the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path

EXIT_INSTALL = 78  # runner/contract/spec.py names it too (the bot's side); this file imports nothing of ours
BUNDLE_ENV = "TUNEBOT_RUNNER_BUNDLE"
FETCH_ATTEMPTS = 4
FETCH_TIMEOUT_S = 60.0
RUNNER_SCRIPT = "tunebot-runner"


class InstallError(Exception):
    """The runner could not be installed here; the message says which step and why."""


def fetch(item: dict, into: Path, *, attempts: int = FETCH_ATTEMPTS) -> Path:
    """Download one staged file (at most its announced size) and check its SHA-256; the file's path."""
    name = Path(str(item["name"])).name  # never a path of the sender's choosing
    size, digest = int(item["size"]), str(item["sha256"]).lower()
    error: Exception | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(min(30.0, 2.0**attempt))
        try:
            with urllib.request.urlopen(item["url"], timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310
                data = response.read(size + 1)
            break
        except OSError as exc:  # URLError, HTTPError, timeouts, resets: try again
            error = exc
    else:
        why = f"{type(error).__name__}: {error}"
        raise InstallError(f"{name} could not be fetched from the job's storage ({why})")
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise InstallError(
            f"{name} is not what the bot staged (SHA-256 or size differs from the create call's): refused, "
            "nothing installed"
        )
    path = into / name
    path.write_bytes(data)
    return path


def installed_torch() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise InstallError(
            "this image has no torch: use a PyTorch image (TUNEBOT_STOCK_IMAGE) or a prebuilt runner image "
            "(TUNEBOT_RUNNER_IMAGE)"
        ) from None


def runner_command() -> list[str]:
    """The installed entry point: the interpreter's scripts folder, else the user scheme's (pip falls back to
    it where site-packages is read-only), else the module run from an empty folder (nothing there can shadow
    it)."""
    for folder in (sysconfig.get_path("scripts"), os.path.join(site.getuserbase(), "bin")):
        script = Path(folder) / RUNNER_SCRIPT
        if script.is_file() and os.access(script, os.X_OK):
            return [str(script)]
    return [sys.executable, "-m", "runner.cli"]


def install(bundle: dict, work: Path) -> str:
    """Fetch, check and pip-install the staged runner; returns the wheel's file name."""
    torch = installed_torch()
    wheel = fetch(bundle["wheel"], work)
    constraints = fetch(bundle["constraints"], work)
    pins = work / "pins.txt"  # the staged pins plus the image's own torch, which pip must keep
    pins.write_text(constraints.read_text(encoding="utf-8") + f"\ntorch=={torch}\n", encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        "--constraint",
        str(pins),
        str(wheel),
    ]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        code = done.returncode
        raise InstallError(f"pip install of {wheel.name} failed (exit {code}; its output is above)")
    if has_cuda_device():
        install_optional(bundle.get("optional") or [], pins)
    else:
        print("tunebot: no CUDA device here: optional GPU speed-ups not installed", flush=True)
    return wheel.name


def has_cuda_device() -> bool:
    """An NVIDIA device is visible to this container (no torch import: that is the runner's)."""
    return Path("/proc/driver/nvidia").exists() or Path("/dev/nvidia0").exists()


PIP = [sys.executable, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check"]


def install_optional(names: list, pins: Path, *, pip: list[str] | None = None) -> list[str]:
    """The optional speed-ups (liger-kernel), each on its own, pinned as the rest: one that does not install
    is a line here and the runner trains without it (runner/kernels.py says so again in the job's log).
    Returns those installed."""
    installed = []
    for name in names:
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            continue  # a package name only, never an option or a path
        done = subprocess.run([*(pip or PIP), "--constraint", str(pins), name], check=False)
        if done.returncode == 0:
            installed.append(name)
        else:
            code = done.returncode
            print(f"tunebot: {name} did not install (exit {code}): training without it", flush=True)
    return installed


def main() -> int:
    started = time.monotonic()
    for key, value in (("PYTHONUNBUFFERED", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    work = Path(tempfile.mkdtemp(prefix="tunebot-runner-"))
    try:
        try:
            bundle = json.loads(os.environ[BUNDLE_ENV])
        except (KeyError, ValueError):
            why = f"{BUNDLE_ENV} is missing or not JSON: this host was not started by tunebot"
            raise InstallError(why) from None
        name = install(bundle, work)
    except InstallError as exc:
        print(f"tunebot: cannot start the runner: {exc}", file=sys.stderr, flush=True)
        return EXIT_INSTALL
    print(f"tunebot: runner {name} installed next to torch in {time.monotonic() - started:.1f} s", flush=True)
    command = runner_command()
    os.chdir(work)  # an empty folder of our own: no file in the image's working directory shadows a module
    os.execv(command[0], [*command, *sys.argv[1:]])
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    raise SystemExit(main())
