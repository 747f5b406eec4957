"""The runner on a stock PyTorch image: its wheel and pinned constraints, staged in the job's storage prefix.

By default (TUNEBOT_RUNNER_IMAGE unset) a cloud job runs on TUNEBOT_STOCK_IMAGE, a public PyTorch CUDA image
of the kind Vast's and RunPod's templates use: nothing has to be built or published before a team's first
cloud job. For each launch the bot

- builds the runner's wheel from the ``runner`` package this bot runs (``wheel``): written with the standard
  library's zipfile, byte for byte the same for the same sources, cached in <data dir>/runner-wheels under a
  name holding the package's content hash - no build tool is needed, a bot-only install (`pip install .`)
  builds it as well as a checkout;
- writes the constraints file (``constraints``): pinned versions of the libraries the runner trains with, the
  versions this machine's own runner uses where it has them all (the [runner] extra), else those this release
  was tested with (TESTED_PINS), and the optional speed-ups' (OPTIONAL: liger-kernel, installed after the
  runner where it installs; the run goes on without it otherwise);
- uploads both under ``<run folder>/runner/`` and hands the host, in the create call, presigned URLs made
  with the very credentials the host gets, their sizes and SHA-256 (TUNEBOT_RUNNER_BUNDLE) and the start
  program runner/bootstrap.py (TUNEBOT_BOOTSTRAP, base64): the host fetches both, checks them against the
  create call's SHA-256, pip-installs the wheel next to the image's torch (pinned to itself, never
  reinstalled) and starts `tunebot-runner` (``BOOTSTRAP_COMMAND``).

The install takes time on every start (libraries downloaded on a fresh host, about INSTALL_MINUTES): the
estimate prices it as start-up time of every cloud offer (``with_install``). A team's own prebuilt image
(TUNEBOT_RUNNER_IMAGE, scripts/runner-image.sh, the Dockerfile) has the runner inside: nothing is staged then.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import os
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.planner.offer import Offer
    from bot.settings import Settings

DIST = "tunebot-runner"  # not "tunebot": the host gets the runner, not the bot
# What the runner imports beyond the standard library and torch (the image's own): the wheel's requirements.
RUNNER_REQUIREMENTS = (
    "pydantic>=2.6",
    "httpx>=0.27",
    "numpy",
    "jinja2>=3.1",
    "fsspec>=2024.2",
    "s3fs>=2024.2",
    "huggingface_hub",
    "transformers>=4.45",
    "tokenizers>=0.19",
    "safetensors>=0.4",
    "peft>=0.12",
    "accelerate>=0.34",
    "bitsandbytes>=0.43",
    "wandb>=0.17",
    "cryptography>=42",  # runner/contract/sealed.py opens the renewed credentials sealed to its run
)
# Pinned in the constraints file (the list, with what they drag in that the runner imports itself).
PINNED = (
    "transformers",
    "tokenizers",
    "huggingface_hub",
    "peft",
    "bitsandbytes",
    "accelerate",
    "safetensors",
    "wandb",
    "fsspec",
    "s3fs",
    "pydantic",
    "httpx",
    "cryptography",
)
# The versions this release was tested with (the test suite's environment); used where this machine does not
# have the whole set (a bot-only install).
TESTED_PINS = {
    "transformers": "5.25.0",
    "tokenizers": "0.23.3",
    "huggingface_hub": "2.4.0",
    "peft": "0.21.2",
    "bitsandbytes": "0.50.2",
    "accelerate": "1.16.0",
    "safetensors": "0.8.0",
    "wandb": "0.31.0",
    "fsspec": "2026.9.0",
    "s3fs": "2026.9.0",
    "pydantic": "2.14.4",
    "httpx": "0.29.0",
    "cryptography": "50.0.2",
}
# Installed after the runner where they install, each on its own (runner/bootstrap.py): a speed-up that does
# not install leaves a line in the job's log and the run trains without it (runner/kernels.py). Pinned in the
# constraints as the rest: this machine's version where it has it (a CUDA host's bot), else the tested one.
OPTIONAL = ("liger-kernel",)
OPTIONAL_PINS = {"liger-kernel": "0.8.5"}
INSTALL_MINUTES = 1.5  # fetch + pip on a fresh host (docs: "on the order of a minute"); priced as start-up
PACKAGE_DATA = (".py", ".json", ".ini", ".mako", ".yml", ".yaml")  # pyproject.toml's package data, and code
WHEEL_FILE = b"Wheel-Version: 1.0\nGenerator: tunebot\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zip entries' time: the same sources make the same bytes
BUNDLE_ENV = "TUNEBOT_RUNNER_BUNDLE"
BOOTSTRAP_ENV = "TUNEBOT_BOOTSTRAP"
# The container's command on the stock image: the start program from the environment (no quotes, newlines or
# spaces in it for a cloud's command field to mangle; docker --env-file carries the base64 on one line).
BOOTSTRAP_COMMAND = (
    "python3",
    "-c",
    "import base64,os;"
    'exec(compile(base64.b64decode(os.environ["TUNEBOT_BOOTSTRAP"]),"tunebot-bootstrap","exec"))',
)
URL_SECONDS = 7 * 24 * 3600  # a presigned URL's longest life (SigV4); STS-made ones end with their session


class StagingError(Exception):
    """The runner could not be staged for this job (the message says where and why)."""


@dataclass(frozen=True)
class Built:
    path: Path
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return self.path.name


def uses_stock_image(settings: Settings) -> bool:
    """TUNEBOT_RUNNER_IMAGE unset: hosts start TUNEBOT_STOCK_IMAGE and install the staged runner."""
    return not (settings.runner_image or "").strip()


def image_for(settings: Settings) -> str:
    """The image a cloud host pulls."""
    return settings.runner_image.strip() if not uses_stock_image(settings) else settings.stock_image  # type: ignore[union-attr]


def install_minutes(settings: Settings) -> float:
    """Start-up time the install adds to every cloud start (0 with a prebuilt runner image)."""
    return INSTALL_MINUTES if uses_stock_image(settings) else 0.0


def with_install(offers: Iterable[Offer], minutes: float) -> list[Offer]:
    """Cloud offers with the install added to their start-up time (this machine's own CPU needs none)."""
    from bot.planner.rank import BOOT_HOURS

    out = []
    for o in offers:
        if minutes and o.provider != "local":
            boot = o.boot_minutes if o.boot_minutes is not None else BOOT_HOURS * 60
            o = o.model_copy(update={"boot_minutes": round(boot + minutes, 3)})
        out.append(o)
    return out


def install_note(settings: Settings) -> str | None:
    if not uses_stock_image(settings):
        return None
    return (
        f"start-up: cloud hosts start {settings.stock_image} and install the runner staged in the job's "
        f"storage (about {INSTALL_MINUTES:g} min, priced with every start; TUNEBOT_RUNNER_IMAGE: a prebuilt "
        "image instead)"
    )


# --- the wheel ----------------------------------------------------------------------------------------------
def runner_files() -> list[tuple[str, bytes]]:
    """The ``runner`` package this bot runs, as (path in the wheel, content), sorted."""
    spec = importlib.util.find_spec("runner")
    if spec is None or not spec.submodule_search_locations:
        raise StagingError("the runner package is not installed with this bot: reinstall tunebot")
    root = Path(list(spec.submodule_search_locations)[0])
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or "__pycache__" in rel.parts or path.suffix not in PACKAGE_DATA:
            continue
        files.append((f"runner/{rel.as_posix()}", path.read_bytes()))
    return files


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tunebot")
    except PackageNotFoundError:
        return "0.0.0"


def _metadata(version: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DIST}",
        f"Version: {version}",
        "Summary: tunebot's training runner, staged by the bot for one job",
        "Requires-Python: >=3.10",
        *(f"Requires-Dist: {r}" for r in RUNNER_REQUIREMENTS),
    ]
    return "\n".join(lines) + "\n"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_bytes(files: Sequence[tuple[str, bytes]], version: str) -> tuple[str, bytes]:
    """(file name, bytes) of the wheel: deterministic (sorted entries, fixed times and modes)."""
    info = f"{DIST.replace('-', '_')}-{version}.dist-info"
    entries = list(files) + [
        (f"{info}/METADATA", _metadata(version).encode()),
        (f"{info}/WHEEL", WHEEL_FILE),
        (f"{info}/entry_points.txt", b"[console_scripts]\ntunebot-runner = runner.cli:main\n"),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    return f"{DIST.replace('-', '_')}-{version}-py3-none-any.whl", buffer.getvalue()


def wheel(cache: Path) -> Built:
    """The runner's wheel, built once per content (its name holds the content hash) and kept in ``cache``."""
    files = runner_files()
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    digest.update(_metadata(_version()).encode())
    version = f"{_version()}+{digest.hexdigest()[:16]}"
    name = f"{DIST.replace('-', '_')}-{version}-py3-none-any.whl"
    path = cache / name
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        built_name, data = wheel_bytes(files, version)
        assert built_name == name
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    data = path.read_bytes()
    return Built(path, hashlib.sha256(data).hexdigest(), len(data))


# --- the constraints ----------------------------------------------------------------------------------------
def pins() -> tuple[dict[str, str], str]:
    """The pinned versions and where they come from: this machine's own runner libraries when it has them
    all (its local runner trains with exactly these), else TESTED_PINS."""
    from importlib.metadata import PackageNotFoundError, version

    here: dict[str, str] = {}
    for name in PINNED:
        try:
            here[name] = version(name)
        except PackageNotFoundError:
            return dict(TESTED_PINS), "the versions this release was tested with"
    return here, "the versions this bot's own runner uses"


def optional_pins() -> dict[str, str]:
    """The optional speed-ups' pins: this machine's versions where it has them, else the tested ones."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name, tested in OPTIONAL_PINS.items():
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = tested
    return out


def constraints() -> str:
    pinned, source = pins()
    head = f"# tunebot runner constraints: {source}; torch stays the image's own (pinned on the host)\n"
    lines = "".join(f"{name}=={v}\n" for name, v in sorted(pinned.items()))
    optional = "".join(f"{name}=={v}\n" for name, v in sorted(optional_pins().items()))
    return head + lines + "# optional speed-ups (installed where they install)\n" + optional


# --- staging ------------------------------------------------------------------------------------------------
def _split(uri: str) -> tuple[str, str]:
    rest = uri.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key


def presign(uri: str, env: Mapping[str, str], *, seconds: int = URL_SECONDS) -> str:
    """A GET URL for one object, signed with these (the host's own) storage credentials."""
    import botocore.session
    from botocore.config import Config

    endpoint = env.get("AWS_ENDPOINT_URL") or None
    client = botocore.session.Session().create_client(
        "s3",
        region_name=env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path" if endpoint else "auto"}),
    )
    bucket, key = _split(uri)
    return str(
        client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=min(seconds, URL_SECONDS)
        )
    )


def _upload(data: bytes, target: str) -> None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(target)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)


def stage(settings: Settings, root: str, env: Mapping[str, str]) -> dict[str, str]:
    """Upload the wheel and the constraints under ``<root>/runner/`` and return what the create call adds to
    the host's environment (``env``: the host's own, whose storage credentials sign the URLs)."""
    if not root.startswith("s3://"):
        raise StagingError(
            f"the runner is staged in object storage over the S3 API, and {root} is not: set "
            "TUNEBOT_CHECKPOINT_URI to s3://... (AWS, R2, MinIO, B2), or TUNEBOT_RUNNER_IMAGE to an image "
            "with the runner inside (scripts/runner-image.sh)"
        )
    built = wheel(settings.data_dir / "runner-wheels")
    text = constraints().encode()
    folder = f"{root.rstrip('/')}/runner"
    items: dict[str, Any] = {}
    try:
        for key, name, data in (
            ("wheel", built.name, built.path.read_bytes()),
            ("constraints", "constraints.txt", text),
        ):
            uri = f"{folder}/{name}"
            _upload(data, uri)  # every launch: an earlier run's host could have written here
            items[key] = {
                "name": name,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "url": presign(uri, env),
            }
    except Exception as exc:  # noqa: BLE001 - storage trouble of any kind: say where and why
        why = f"{type(exc).__name__}: {exc}"
        raise StagingError(f"could not stage the runner under {folder}/: {why}") from None
    items["optional"] = list(OPTIONAL)  # pip-installed after the runner where they install
    return {BUNDLE_ENV: json.dumps(items, sort_keys=True), BOOTSTRAP_ENV: bootstrap_b64()}


def bootstrap_b64() -> str:
    """runner/bootstrap.py, base64: the start program the create call carries."""
    spec = importlib.util.find_spec("runner.bootstrap")
    if spec is None or spec.origin is None:
        raise StagingError("runner/bootstrap.py is missing from this install: reinstall tunebot")
    return base64.b64encode(Path(spec.origin).read_bytes()).decode()
