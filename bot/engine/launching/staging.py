"""Before a job rents anything: its data checked, its storage reachable, its inputs where the host reads them.

A rented GPU host sees only what the provider API call carries (image, command, environment) and what it
can reach by URI. So, when a job is created:

- every option the runner cannot honour is refused (estimate-only techniques, flash attention the image
  lacks, a Hub push without a token, a config.json that has no weights);
- the dataset is read on the bot's side with the runner's own rules (runner/contract/records.py): its
  format found or checked, the first bad line named;
- a job that may run on a remote host needs a checkpoint location the host can reach: when
  TUNEBOT_CHECKPOINT_URI is unset (the bot's own disk) or process-local, a cloud job is refused naming the
  setting (a local job keeps only same-host fallbacks);
- the caller's checks before renting run next (bot/engine/launching/preflight.py: image, model access, storage
  probe), before anything is uploaded;
- the spec must fit the one environment variable it travels in (``check_spec_size``: Linux takes at most
  131,072 bytes for one, and a longer one fails the runner's start with E2BIG on a host already rented);
- local dataset files and model folders are uploaded (staged) under ``<TUNEBOT_CHECKPOINT_URI>/inputs/``,
  content-addressed so a second job with the same data uploads nothing;
- the storage credentials go to the instance as environment variables (``runner_env``), never into the
  spec, messages or logs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.engine.api import EngineError
from bot.planner.request import EstimateRequest, runner_autocast
from bot.planner.result import RankedOffer, TrainingPlan

if TYPE_CHECKING:
    from bot.settings import Settings
    from runner.contract.reading import ReadLimits

log = logging.getLogger(__name__)

LOCAL_SCHEMES = frozenset({"", "file", "local", "memory"})  # the bot's disk, or this process's memory
CHECK_RECORDS = 200_000  # records read bot-side before launch (the runner reads them all again)
# One environment string ("TUNEBOT_JOB_SPEC=<spec>" and its NUL) may be at most MAX_ARG_STRLEN bytes on Linux
# (32 pages of 4 KB): a longer spec is E2BIG when the host starts the runner, after the instance was rented.
MAX_ENV_STRING = 131_072
# What a launch adds to a stored plan (bot/engine/launching/launch.py build_spec): the run's folders, the
# report URL and token, up to 8 resume points, the cost fields, W&B.
LAUNCH_RESERVE = 16 * 1024
# EstimateRequest fields the planner can price for other training stacks; the runner does one value of each:
# the request's own default (request.py: a field not given is what the runner does), so every method's
# defaults launch (issue 38: a hard-coded "bf16" refused a full fine-tune's default, mixed precision).
ESTIMATE_ONLY = (
    "stack",
    "compile",
    "chunked_ce",
    "optimizer_in_backward",
    "activation_offload",
    "nf4_quantizer",
    "adapter_dtype",
    "double_quant",
    "qlora_upcast",
)
STORAGE_ENV = {  # setting -> environment variable the runner's fsspec/botocore reads
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "aws_region": "AWS_DEFAULT_REGION",
    "aws_endpoint_url": "AWS_ENDPOINT_URL",
}


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def is_local(uri: str) -> bool:
    """A location only this machine (or this process) can read."""
    return scheme(uri) in LOCAL_SCHEMES


def shares_disk(provider: Any) -> bool:
    """Instances of this provider run on the bot's machine and read its files (the local provider)."""
    caps = getattr(provider, "capabilities", None)
    return getattr(caps, "kind", "") == "process"


@dataclass
class PreparedJob:
    """What creating a job decided: where the runner reads its inputs, and on which offers it may run."""

    base_model: str
    dataset_uri: str
    dataset_format: str
    offers: list[RankedOffer]
    notes: list[str] = field(default_factory=list)
    prompts: list[dict[str, Any]] | None = None  # the prompts file's lines, checked (sent in the spec)


def storage_env(settings: Settings) -> dict[str, str]:
    """The storage credentials a runner needs, as its environment (values never logged)."""
    env: dict[str, str] = {}
    for name, var in STORAGE_ENV.items():
        value = getattr(settings, name, None)
        if value is None:
            continue
        env[var] = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    for var in (n.strip() for n in settings.runner_env_names.split(",")):
        if var and var in os.environ:
            env[var] = os.environ[var]
    return env


def refuse_unsupported(
    request: EstimateRequest, plan: TrainingPlan, settings: Settings, *, remote: bool
) -> None:
    """Options the runner cannot honour, refused before anything is spent."""
    runner_does = EstimateRequest(model=request.model, method=request.method)  # nothing else given
    odd = [name for name in ESTIMATE_ONLY if getattr(request, name) != getattr(runner_does, name)]
    if request.autocast != runner_autocast(request.method, request.precision):
        odd.append("autocast")  # the runner autocasts a mixed-precision full fine-tune only
    if odd:
        raise EngineError(
            f"{', '.join(odd)}: estimate-only options (they price other training stacks); the runner trains "
            "with transformers + peft - drop them to launch"
        )
    if plan.attn == "flash" and remote and not settings.runner_flash_attention:
        raise EngineError(
            "attn=flash: the runner image has no flash-attn; use attn=sdpa, or build the image with "
            "FLASH_ATTN=1 (scripts/runner-image.sh) and set TUNEBOT_RUNNER_FLASH_ATTN=1"
        )
    if plan.merge and plan.method == "full":
        raise EngineError(
            "merge=yes folds an adapter into the base model; a full fine-tune already saves the whole "
            "model: drop merge"
        )
    if plan.gpus > 1 and plan.optimizer != "adamw":
        raise EngineError(
            f"optimizer={plan.optimizer} (bitsandbytes) breaks checkpoint saves under FSDP, which several "
            "GPUs use: use optimizer=adamw with gpus > 1"
        )
    if plan.push_to_hub and settings.hf_token is None:
        raise EngineError(
            f"push_to_hub={plan.push_to_hub} needs HF_TOKEN set for the bot (the bot pushes the output "
            "itself; the token never reaches a runner)"
        )
    model = Path(plan.base_model).expanduser()
    if plan.base_model.endswith(".json") or (model.is_dir() and not _has_weights(model)):
        raise EngineError(
            f"{plan.base_model} has no weights (a config.json prices a model but cannot train it): give the "
            "model folder or its hub id"
        )


def _has_weights(folder: Path) -> bool:
    return any(p.suffix in (".safetensors", ".bin") for p in folder.rglob("*") if p.is_file())


def check_dataset(uri: str, fmt: str | None, limits: ReadLimits | None = None) -> str:
    """Read the dataset with the runner's rules, bounded (``limits``: TUNEBOT_DATASET_*); its format.
    EngineError naming the first bad line or the limit hit."""
    from runner.contract.records import DatasetError, check_dataset

    try:
        found = check_dataset(uri, fmt, limit=CHECK_RECORDS, limits=limits)
    except DatasetError as exc:
        raise EngineError(f"the dataset cannot be trained on: {exc}") from None
    return found.format.value


def check_prompts(uri: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` lines of a prompts file, read bounded and checked with the runner's rules
    (runner/contract/prompts.py): they travel inside the spec, so the host never reads the file. EngineError
    naming the bad line."""
    from runner.contract.prompts import read_prompt_lines
    from runner.contract.reading import DatasetError

    try:
        return read_prompt_lines(uri, limit=max(count, 1))
    except DatasetError as exc:
        raise EngineError(f"prompts: {exc}") from None
    except OSError as exc:
        raise EngineError(f"prompts: cannot read {uri}: {exc.strerror or type(exc).__name__}") from None


def spec_env_bytes(spec_json: str) -> int:
    """The bytes of the environment string a spec travels in: ``TUNEBOT_JOB_SPEC=<json>`` and its NUL."""
    from bot.engine.launching.instance_env import SPEC_ENV

    return len(f"{SPEC_ENV}=".encode()) + len(spec_json.encode()) + 1


def spec_too_large(spec_json: str, *, reserve: int = 0) -> str | None:
    """Why a spec (with ``reserve`` bytes still to be added) cannot reach a host, or None (pure)."""
    size = spec_env_bytes(spec_json) + reserve
    if size <= MAX_ENV_STRING:
        return None
    return (
        f"the job's spec would take {size:,} bytes, more than the {MAX_ENV_STRING:,} one environment "
        "variable may hold on a host (the runner could not start): fewer or shorter prompts, shorter paths"
    )


def check_spec_size(plan: dict[str, Any]) -> None:
    """EngineError, before anything is created or rented, when the job's plan (the spec's training fields)
    with what a launch adds would not fit the environment variable the spec travels in."""
    import json

    text = json.dumps(plan, ensure_ascii=False, separators=(",", ":"))
    problem = spec_too_large(text, reserve=LAUNCH_RESERVE)
    if problem:
        raise EngineError(problem)


def prepare(
    settings: Settings,
    providers: dict[str, Any],
    request: EstimateRequest,
    plan: TrainingPlan,
    chosen: RankedOffer,
    fitting: list[RankedOffer],
    checks: Callable[[list[RankedOffer]], list[RankedOffer]] | None = None,
) -> PreparedJob:
    """Check a job before it is created; stage its inputs when a remote host may run it. ``checks`` (the
    preflight) sees the offers left after the cheap local checks and may drop some, before any upload."""
    dataset = request.dataset or ""
    remote = [o for o in fitting if not shares_disk(providers.get(o.provider))]
    chosen_remote = not shares_disk(providers.get(chosen.provider))
    refuse_unsupported(request, plan, settings, remote=chosen_remote)
    fmt = check_dataset(dataset, plan.dataset_format, settings.dataset_limits())
    prompts = check_prompts(request.prompts, request.samples) if request.prompts else None
    notes: list[str] = []
    offers = list(fitting)
    root = settings.checkpoint_base_uri or ""
    if remote and (not root or is_local(root)):
        where = (
            f"{root} is on this machine"
            if root
            else "TUNEBOT_CHECKPOINT_URI is not set, so checkpoints go to this machine's disk"
        )
        if chosen_remote:
            raise EngineError(
                f"{chosen.provider} runs the job on a remote host that cannot reach this bot's disk "
                f"({where}): set TUNEBOT_CHECKPOINT_URI to object storage the host can reach (e.g. "
                "s3://bucket/tunebot, with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL "
                "for R2, MinIO, B2)"
            )
        offers = [o for o in fitting if shares_disk(providers.get(o.provider))]
        notes.append("cloud fallbacks dropped: TUNEBOT_CHECKPOINT_URI is not object storage")
        remote = []
    base_model = plan.base_model
    keyless = settings.aws_access_key_id is None and settings.aws_session_token is None
    if remote and scheme(root) == "s3" and keyless:
        raise EngineError(
            f"TUNEBOT_CHECKPOINT_URI is {root}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY so "
            "that the runner can write checkpoints there (they reach it as instance environment "
            "variables)"
        )
    if checks is not None:
        offers = checks(offers)
        remote = [o for o in offers if not shares_disk(providers.get(o.provider))]
    if remote:
        # Where a host's credentials cannot read its inputs without also writing them (R2), each job gets
        # copies of its own: no other job reads what this job's host could change.
        private = inputs_writable(settings)
        if is_local(dataset):
            dataset = stage_file(Path(dataset.removeprefix("file://")).expanduser(), root, private=private)
            notes.append(f"dataset staged to {dataset}")
        elif private and scheme(dataset) == "s3":
            dataset = private_copy(dataset, root)
            notes.append(f"dataset copied to {dataset} (this job's own copy)")
        local_model = Path(plan.base_model.removeprefix("file://")).expanduser()
        if is_local(plan.base_model) and local_model.is_dir():
            base_model = stage_folder(local_model, root, private=private)
            notes.append(f"model staged to {base_model}")
        elif private and scheme(plan.base_model) == "s3":
            base_model = private_copy(plan.base_model, root, folder=True)
            notes.append(f"model copied to {base_model} (this job's own copy)")
    # A path on this machine is kept absolute: the runner starts in a folder of its own, and the process that
    # relaunches the job (a supervisor started elsewhere) may have another working directory.
    return PreparedJob(
        base_model=_absolute(base_model),
        dataset_uri=_absolute(dataset),
        dataset_format=fmt,
        offers=offers,
        notes=notes,
        prompts=prompts,
    )


def _absolute(uri: str) -> str:
    """A relative path that names something here, made absolute; anything else (a Hub id, a URI) as it is."""
    if scheme(uri) or not uri:
        return uri
    path = Path(uri).expanduser()
    return os.path.abspath(path) if not path.is_absolute() and path.exists() else uri


def _digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def inputs_writable(settings: Settings) -> bool:
    """Runners' credentials on this store cannot read inputs without writing them (R2's temporary
    credentials carry one permission): inputs are then staged per job (bot/storage/scope.py)."""
    from bot.storage.credentials import Mode, choose

    return choose(settings)[0] is Mode.r2


def _private_dir() -> str:
    return f"private-{uuid.uuid4().hex[:12]}"


def private_copy(uri: str, root: str, *, folder: bool = False) -> str:
    """A copy of an input already in the store, for one job only (a server-side copy)."""
    import fsspec

    name = uri.rstrip("/").rsplit("/", 1)[-1]
    target = f"{root.rstrip('/')}/inputs/{_private_dir()}/{name}"
    try:
        fs, src = fsspec.core.url_to_fs(uri)
        _, dst = fsspec.core.url_to_fs(target)
        fs.copy(src, dst, recursive=folder)
    except Exception as exc:  # noqa: BLE001 - storage trouble of any kind: say where and why
        raise EngineError(f"could not copy {uri} to {target}: {type(exc).__name__}: {exc}") from None
    return target


def stage_file(path: Path, root: str, *, private: bool = False) -> str:
    """Upload a file under ``<root>/inputs/<sha256 prefix>/<name>`` (skipped when already there); ``private``:
    under a folder of its own, always uploaded (one job's copy)."""
    import fsspec

    if not path.is_file():
        raise EngineError(f"dataset file {path} does not exist")
    where = _private_dir() if private else _digest_file(path)[:16]
    target = f"{root.rstrip('/')}/inputs/{where}/{path.name}"
    try:
        fs, remote = fsspec.core.url_to_fs(target)
        if private or not (fs.exists(remote) and fs.size(remote) == path.stat().st_size):
            fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(path), remote)
    except Exception as exc:  # noqa: BLE001 - storage trouble of any kind: say where and why
        raise EngineError(f"could not upload {path.name} to {target}: {type(exc).__name__}: {exc}") from None
    return target


def folder_files(folder: Path) -> list[Path]:
    """The files of a model folder to upload (dotfiles left out). A symbolic link is followed only when it
    stays inside the folder (or, for a Hugging Face cache snapshot, inside its repo's ``blobs/``); any other
    link is refused, naming it, so that no file outside the folder is uploaded to the bucket."""
    root = folder.resolve()
    inside = [root]
    if root.parent.name == "snapshots":  # ~/.cache/huggingface/hub/models--org--name/snapshots/<rev>/
        inside.append(root.parent.parent / "blobs")
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            path = here / name
            if not path.is_symlink():
                if name in filenames and not name.startswith("."):
                    files.append(path)
                continue
            shown = path.relative_to(folder).as_posix()
            target = path.resolve()
            if not any(target.is_relative_to(base) for base in inside):
                raise EngineError(
                    f"{shown} in the model folder is a symbolic link to something outside it: refused "
                    "(links are never followed out of a staged folder; copy the file in instead)"
                )
            if target.is_file() and not name.startswith("."):
                files.append(path)  # a link inside the folder: its content, under the link's name
    return sorted(files)


def stage_folder(folder: Path, root: str, *, private: bool = False) -> str:
    """Upload a model folder under ``<root>/inputs/models/<name>-<digest>/`` (files already there of the
    same size are skipped); the digest covers every file's name and content. ``private``: under a folder
    of its own (one job's copy)."""
    import fsspec

    files = folder_files(folder)
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(folder).as_posix().encode())
        h.update(_digest_file(p).encode())
    target = f"{root.rstrip('/')}/inputs/models/{folder.name}-{h.hexdigest()[:12]}"
    if private:
        target = f"{root.rstrip('/')}/inputs/{_private_dir()}/{folder.name}"
    try:
        fs, remote = fsspec.core.url_to_fs(target)
        for p in files:
            dest = f"{remote}/{p.relative_to(folder).as_posix()}"
            if fs.exists(dest) and fs.size(dest) == p.stat().st_size:
                continue
            fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(p), dest)
    except Exception as exc:  # noqa: BLE001
        problem = f"{type(exc).__name__}: {exc}"
        raise EngineError(f"could not upload the model folder to {target}: {problem}") from None
    return target
