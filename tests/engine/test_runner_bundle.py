"""A first cloud job with nothing to publish (issue 27): the default runner image was published nowhere, so a
new team's first cloud job failed preflight or never started.

Now hosts start a public stock PyTorch image and install the runner the bot stages
(bot/engine/launching/runner_bundle.py, runner/bootstrap.py): its wheel, built here without any build tool and
cached by content, and a constraints file; the host checks both against the SHA-256 in the create call. The
end-to-end path is tests/chat/test_e2e_remote_host.py; these are its parts, and what a launch asks of the
cloud.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import http.server
import json
import os
import site
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fakes.clouds import FakeVast
from fakes.clouds.fixtures import client_for
from fakes.registry import FakeRegistry
from fakes.remote_host import StockImage
from fakes.s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)

from bot.engine.launching import preflight, runner_bundle
from bot.planner.request import EstimateRequest
from bot.providers import catalog
from bot.settings import STOCK_IMAGE, Settings

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"instruction": f"add {i} and {i}", "input": "", "output": str(2 * i)} for i in range(40)]


def test_the_wheel_is_built_without_build_tools_and_cached_by_content(tmp_path: Path) -> None:
    """No pip wheel, build or setuptools in the bot process: a bot-only install builds it too."""
    boot = tmp_path / "no-build-tools"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(
        "import sys\n"
        "for m in ('setuptools', 'wheel', 'build', 'pip', 'distutils'):\n"
        "    sys.modules[m] = None\n"
    )
    code = (
        "import json, sys; from pathlib import Path; from bot.engine.launching.runner_bundle import wheel; "
        "b = wheel(Path(sys.argv[1])); print(json.dumps([b.name, b.sha256, b.size]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(boot), os.environ.get("PYTHONPATH", "")])}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "cache")], env=env, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    first, second = (json.loads(r.stdout) for r in runs)
    assert first == second and len(list((tmp_path / "cache").iterdir())) == 1  # the same bytes, built once
    name, digest, size = first
    data = (tmp_path / "cache" / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest and len(data) == size
    with zipfile.ZipFile(tmp_path / "cache" / name) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        entry = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "runner/cli.py" in names and "runner/train.py" in names and "runner/bootstrap.py" in names
    # The contract the bot and the runner agree on travels with the runner, every module of it.
    contract = sorted(f"runner/contract/{p.name}" for p in (ROOT / "runner" / "contract").glob("*.py"))
    assert "runner/contract/spec.py" in contract and set(contract) <= set(names)
    assert not [n for n in names if n.startswith(("bot/", "store/")) or "__pycache__" in n]
    assert "tunebot-runner = runner.cli:main" in entry
    # another content, another name: the cache is keyed by the package's content hash
    files = runner_bundle.runner_files()
    other, _ = runner_bundle.wheel_bytes(
        [*files[:-1], (files[-1][0], files[-1][1] + b"\n# changed\n")], "0+x"
    )
    assert other != name


def _third_party_imports() -> set[str]:
    stdlib = set(sys.stdlib_module_names)
    found: set[str] = set()
    for path in (ROOT / "runner").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            found |= {n.split(".")[0] for n in names}
    return found - stdlib - {"runner", "__future__"}


def test_the_wheel_requires_what_the_runner_imports_and_the_constraints_pin_the_libraries() -> None:
    required = {
        r.split(">")[0].split("=")[0].replace("_", "-").lower() for r in runner_bundle.RUNNER_REQUIREMENTS
    }
    optional = {
        "torch",
        "liger_kernel",
        "flash_attn",
        "pynvml",
    }  # the image's own torch; kernels and NVML used where present
    missing = {m for m in _third_party_imports() - optional if m.replace("_", "-").lower() not in required}
    assert not missing, f"runner/ imports {sorted(missing)}, which the staged wheel does not require"
    text = runner_bundle.constraints()
    pinned = dict(line.split("==") for line in text.splitlines() if "==" in line)
    for name in (
        "transformers",
        "peft",
        "bitsandbytes",
        "accelerate",
        "safetensors",
        "wandb",
        "fsspec",
        "s3fs",
    ):
        assert name in pinned and pinned[name][0].isdigit(), name
    assert "torch" not in pinned  # the image's own, pinned on the host
    assert set(runner_bundle.TESTED_PINS) == set(runner_bundle.PINNED)


def test_a_bot_only_install_pins_the_tested_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    real = md.version

    def version(name: str) -> str:
        if name == "peft":  # the [runner] extra is not installed here
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "version", version)
    pinned, source = runner_bundle.pins()
    assert pinned == runner_bundle.TESTED_PINS and "tested" in source


# --- the start program on the host -------------------------------------------------------------------------


@pytest.fixture
def files_served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    folder = tmp_path / "served"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, directory=str(folder), **kw)

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _item(folder: Path, url: str, name: str, data: bytes, *, claimed: bytes | None = None) -> dict:
    (folder / name).write_bytes(data)
    said = claimed if claimed is not None else data
    return {
        "name": name,
        "size": len(said),
        "sha256": hashlib.sha256(said).hexdigest(),
        "url": f"{url}/{name}",
    }


def _start(
    tmp_path: Path, bundle: dict, *, site_packages: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    image = tmp_path / "image"
    env = {
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        **StockImage(site_packages=site_packages).prepare(image),
        runner_bundle.BUNDLE_ENV: json.dumps(bundle),
        runner_bundle.BOOTSTRAP_ENV: runner_bundle.bootstrap_b64(),
    }
    command = list(runner_bundle.BOOTSTRAP_COMMAND)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_the_host_installs_the_staged_wheel_and_starts_its_runner(tmp_path: Path, files_served) -> None:
    folder, url = files_served
    built = runner_bundle.wheel(tmp_path / "cache")
    text = runner_bundle.constraints().encode()
    bundle = {
        "wheel": _item(folder, url, built.name, built.path.read_bytes()),
        "constraints": _item(folder, url, "constraints.txt", text),
    }
    done = _start(tmp_path, bundle, site_packages=tuple(site.getsitepackages()))
    assert f"tunebot: runner {built.name} installed next to torch in" in done.stdout, done.stderr[-3000:]
    assert done.returncode == 2 and "no job spec" in done.stderr  # tunebot-runner itself, without a spec
    (installed,) = (tmp_path / "image" / "lib").glob("python3*/site-packages/runner/cli.py")
    assert installed.read_bytes() == (ROOT / "runner" / "cli.py").read_bytes()


def test_a_swapped_wheel_is_refused_before_anything_is_installed(tmp_path: Path, files_served) -> None:
    folder, url = files_served
    built = runner_bundle.wheel(tmp_path / "cache")
    real = built.path.read_bytes()
    evil = real.replace(b"runner", b"Runner", 1)  # what an earlier run's host could write into the prefix
    bundle = {
        "wheel": _item(folder, url, built.name, evil, claimed=real),
        "constraints": _item(folder, url, "constraints.txt", b"peft==0.0.0\n"),
    }
    done = _start(tmp_path, bundle, site_packages=tuple(site.getsitepackages()))
    assert done.returncode == runner_bundle_exit() == 78
    assert "tunebot: cannot start the runner:" in done.stderr and "is not what the bot staged" in done.stderr
    assert not list((tmp_path / "image" / "lib").glob("python3*/site-packages/runner"))


def test_an_image_without_torch_says_so(tmp_path: Path, files_served) -> None:
    folder, url = files_served
    bundle = {"wheel": _item(folder, url, "w.whl", b"x"), "constraints": _item(folder, url, "c.txt", b"")}
    done = _start(tmp_path, bundle, site_packages=())  # a plain Python: no torch
    assert done.returncode == 78 and "this image has no torch" in done.stderr, done.stderr


def runner_bundle_exit() -> int:
    from runner.contract.spec import EXIT_INSTALL

    return EXIT_INSTALL


# --- what a launch asks of the cloud, and what the estimate prices -----------------------------------------


def test_install_time_is_priced_as_start_up_of_every_cloud_offer() -> None:
    from bot.engine.launching.offers import snapshot_estimate

    req = EstimateRequest(model="meta-llama/Llama-3.2-1B", method="lora", tokens=2_000_000)
    stock = snapshot_estimate(req, settings=Settings())
    prebuilt = snapshot_estimate(req, settings=Settings(TUNEBOT_RUNNER_IMAGE="ghcr.io/acme/runner:1"))
    same = {(o.provider, o.offer_id, o.interruptible): o for o in prebuilt.offers}
    pairs = [(o, same[(o.provider, o.offer_id, o.interruptible)]) for o in stock.offers if o.fits]
    assert pairs
    for a, b in pairs:  # at least one start of the install, priced at the offer's rate
        assert a.total_cost > b.total_cost
        if not a.interruptible:  # the compute billed for it (the disk is billed through it too)
            extra = (a.compute_cost - b.compute_cost) / a.price_per_hour * 60
            assert extra == pytest.approx(runner_bundle.INSTALL_MINUTES, rel=0.05), (a, b)
            assert (a.hours - b.hours) * 60 == pytest.approx(runner_bundle.INSTALL_MINUTES, rel=0.01)
    said = " ".join(stock.assumptions)
    assert STOCK_IMAGE in said and "install the runner" in said
    assert "install the runner" not in " ".join(prebuilt.assumptions)


@pytest.fixture(autouse=False)
def _fresh_caches() -> Iterator[None]:
    catalog.clear_cache()
    preflight.clear_cache()
    yield
    preflight.clear_cache()


def test_the_default_launch_needs_no_published_image(
    tmp_path: Path,
    s3_bucket: str,  # noqa: F811
    _fresh_caches: None,
) -> None:
    """No TUNEBOT_RUNNER_IMAGE, and no tunebot image in any registry: preflight checks the public stock image,
    the create call names it with the start command, and the runner is staged in the run's folder."""
    from bot.engine.service import Engine

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with FakeRegistry() as registry, FakeVast(n_offers=40, seed=5) as vast:
        stock = registry.push("pytorch/pytorch", "2.8.0-cuda12.8-cudnn9-runtime", layers=[3_000_000_000])
        settings = Settings(
            TUNEBOT_DATA_DIR=str(tmp_path / "data"),
            TUNEBOT_MIN_RELIABILITY=0.0,
            TUNEBOT_APPROVAL_ABOVE=1e6,
            TUNEBOT_CHECKPOINT_URI=f"{s3_bucket}/tunebot",
            TUNEBOT_STOCK_IMAGE=registry.image("pytorch/pytorch", "2.8.0-cuda12.8-cudnn9-runtime"),
        )
        assert settings.runner_image is None and stock
        eng = Engine(
            settings, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", providers={"vast": client_for(vast)}
        )
        req = EstimateRequest(model="meta-llama/Llama-3.2-1B", method="lora", dataset=str(data), max_steps=5)
        job = eng.create_job(req, user="alice")
        assert job.state == "running", job.message
        assert registry.count("tunebot") == 0 and registry.count("pytorch/pytorch") > 0
        body = vast.last_body("create")
        assert body["image"] == settings.stock_image
        assert body["args"] == list(runner_bundle.BOOTSTRAP_COMMAND)
        program = base64.b64decode(body["env"][runner_bundle.BOOTSTRAP_ENV]).decode()
        assert program == (ROOT / "runner" / "bootstrap.py").read_text()
        bundle = json.loads(body["env"][runner_bundle.BUNDLE_ENV])
        run_id = json.loads(body["env"]["TUNEBOT_JOB_SPEC"])["run_id"]
        assert bundle["optional"] == ["liger-kernel"]  # installed after the runner where it installs
        for item in (bundle["wheel"], bundle["constraints"]):  # in the run's folder (its credentials only)
            folder = f"{s3_bucket}/tunebot/{job.job_id}/runs/{run_id}/runner"
            fs, path = fsspec.core.url_to_fs(f"{folder}/{item['name']}")
            data_ = fs.cat_file(path)
            assert hashlib.sha256(data_).hexdigest() == item["sha256"] and len(data_) == item["size"]
            assert "X-Amz-Signature=" in item["url"] and body["env"]["AWS_ACCESS_KEY_ID"] in item["url"]
        with eng.session() as s:  # the start deadline includes the install
            from store.models import Job

            row = s.get(Job, job.job_id)
            assert row is not None and row.start_deadline_s >= preflight.START_MIN_S
        eng.close()


def test_every_install_carries_the_contract() -> None:
    """pyproject's package list (the bot's install, the runner image's ``pip install .[runner]``) takes
    runner.contract with the runner: the Dockerfile copies the whole runner folder."""
    import tomllib

    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert {"runner", "runner.contract", "runner.data"} <= set(packages)
    assert "COPY runner ./runner" in (ROOT / "Dockerfile").read_text()


def test_an_optional_speed_up_that_does_not_install_leaves_a_line_and_the_start_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """liger-kernel is in the runner's install as an optional speed-up: pinned in the constraints, installed
    on its own after the runner; where it does not install the host says so and starts the runner anyway
    (runner/kernels.py then trains with torch and says why in the job's log)."""
    import runner.bootstrap as bootstrap

    text = runner_bundle.constraints()
    assert f"liger-kernel=={runner_bundle.optional_pins()['liger-kernel']}" in text
    pins = tmp_path / "pins.txt"
    pins.write_text(text)
    failing = [sys.executable, "-c", "import sys; sys.exit(3)"]  # a pip that cannot install it
    assert bootstrap.install_optional(["liger-kernel", "--index-url=x", "../evil"], pins, pip=failing) == []
    out = capfd.readouterr().out
    assert "liger-kernel did not install (exit 3): training without it" in out
    assert "index-url" not in out and "evil" not in out  # only package names are ever passed to pip
    working = [sys.executable, "-c", "import sys; sys.exit(0)"]
    assert bootstrap.install_optional(["liger-kernel"], pins, pip=working) == ["liger-kernel"]
