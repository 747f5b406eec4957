"""Checkpoint manifests: a resume loads only files this job's runner wrote, byte for byte.

Whoever else can write the checkpoint folder (another job's host on a store without per-job
credentials) could plant ``checkpoint-999999/`` or swap ``optimizer.pt``. So every checkpoint carries
``manifest.json``: the job id, the step and each file's name, size and SHA-256, signed with the job's key
(runner/contract/integrity.py). A resume takes the newest complete checkpoint whose manifest verifies,
downloads only the files it lists (plain names, nothing else in the folder) and checks every size and hash
before anything is loaded; a checkpoint that fails is skipped with its reason, and the next older one is
tried. Loading itself runs no code either (runner/checkpoint.py: safetensors, JSON, ``weights_only=True``).

Without a key (a runner started by hand), manifests are written unsigned and checked for sizes and
hashes only.

Keys are per run (runner/contract/integrity.py), so a run verifies with its own key only what it wrote itself
(its own checkpoint folder, after a restart of its process). A checkpoint of an earlier run is loaded only
when the bot names it in the spec (``JobSpec.resume``) with the SHA-256 of its manifest's bytes, recorded from
that run's signed event while it was the job's current run (bot/engine/record/runs.py): ``fetch_pinned``
downloads it only when the manifest hashes to that digest, then checks every file. A host that ran the job
before can still sign with its old key, and may still write its old folder: neither makes a manifest the bot
did not pin.

The output folder has a manifest too (``output_manifest``, purpose "output", relative paths such as
``merged/model.safetensors``): the bot pushes to the Hub only files it lists, each checked
(bot/engine/outcome/hub_push.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.contract.integrity import MANIFEST, OUTPUT, sign, verify

MANIFEST_FILE = "manifest.json"
MARKER = "COMPLETE"
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 4096
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")  # a plain file name: no folders, no '..'


class ManifestError(Exception):
    """This checkpoint cannot be trusted (the message says why)."""


@dataclass(frozen=True)
class Entry:
    size: int
    sha256: str


@dataclass
class Fetched:
    """The checkpoint a resume may load (``step`` None: none), and what was skipped on the way."""

    step: int | None = None
    folder: Path | None = None
    skipped: list[str] = field(default_factory=list)
    uri: str | None = None  # where it was (a pinned checkpoint of an earlier run); None: the run's own folder


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build(folder: Path, *, job_id: str, step: int, key: bytes | None) -> dict[str, Any]:
    """The signed manifest of a staged checkpoint folder (every file but the manifest and the marker)."""
    files = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name not in (MANIFEST_FILE, MARKER)):
        if not SAFE_NAME.match(path.name):
            raise ValueError(f"checkpoint file name {path.name!r} is not a plain name")
        files[path.name] = {"size": path.stat().st_size, "sha256": digest(path)}
    return sign(key, MANIFEST, {"version": 1, "job_id": job_id, "step": step, "files": files})


def write(folder: Path, *, job_id: str, step: int, key: bytes | None) -> Path:
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(build(folder, job_id=job_id, step=step, key=key), indent=1), encoding="utf-8")
    return path


def sha256_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def check(
    raw: bytes, *, job_id: str, step: int, key: bytes | None, pinned: str | None = None
) -> dict[str, Entry]:
    """The files a manifest vouches for; ManifestError when it is not this job's manifest of this step.
    ``pinned``: the SHA-256 the bot recorded for these bytes (a checkpoint of an earlier run): then the bytes
    must hash to it, and no key is asked for."""
    if pinned is not None:
        if len(raw) > MAX_MANIFEST_BYTES or sha256_of(raw) != pinned:
            raise ManifestError("manifest is not the one the bot acknowledged")
        key = None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError("manifest too large")
    try:
        obj = json.loads(raw)
    except ValueError:
        raise ManifestError("manifest is not JSON") from None
    if not isinstance(obj, dict):
        raise ManifestError("manifest is not an object")
    if key is not None and not verify(key, MANIFEST, obj):
        raise ManifestError("manifest not signed with this job's key")
    if obj.get("job_id") != job_id or obj.get("step") != step:
        raise ManifestError(f"manifest names job {obj.get('job_id')!r} step {obj.get('step')!r}")
    files = obj.get("files")
    if not isinstance(files, dict) or not files or len(files) > MAX_FILES:
        raise ManifestError("manifest lists no files")
    out: dict[str, Entry] = {}
    for name, entry in files.items():
        if not isinstance(name, str) or not SAFE_NAME.match(name) or name in (MANIFEST_FILE, MARKER):
            raise ManifestError(f"manifest names {name!r}, not a plain checkpoint file")
        if not isinstance(entry, dict):
            raise ManifestError(f"manifest entry of {name} is not an object")
        size, sha = entry.get("size"), entry.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"manifest size of {name} is not a size")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ManifestError(f"manifest hash of {name} is not a SHA-256")
        out[name] = Entry(size, sha)
    return out


def verify_files(folder: Path, entries: dict[str, Entry]) -> None:
    """Every listed file is in ``folder`` with its size and SHA-256 (ManifestError naming the first that
    is not)."""
    for name, entry in entries.items():
        path = folder / name
        if not path.is_file():
            raise ManifestError(f"{name} is missing")
        if path.stat().st_size != entry.size:
            raise ManifestError(f"{name} has {path.stat().st_size} bytes, the manifest says {entry.size}")
        if digest(path) != entry.sha256:
            raise ManifestError(f"{name} does not match its SHA-256")


def fetch_verified(
    steps: list[int],
    *,
    read: Callable[[int, str, int], bytes | None],
    download: Callable[[int, str, Path, int], None],
    job_id: str,
    key: bytes | None,
    legacy: Callable[[int, Path], object] | None = None,
) -> Fetched:
    """Download the newest checkpoint among ``steps`` (complete ones, any order) that verifies.

    ``read(step, name, limit)`` returns a small file of a checkpoint (None when absent); ``download(step,
    name, into, size)`` fetches one file to a local path (ManifestError when its size is not ``size``).
    ``legacy(step, folder)`` downloads a checkpoint written before manifests, accepted only without a key."""
    out = Fetched()
    for step in sorted(steps, reverse=True):
        folder = Path(tempfile.mkdtemp(prefix=f"tunebot-resume-{step}-"))
        try:
            raw = read(step, MANIFEST_FILE, MAX_MANIFEST_BYTES + 1)
            if raw is None:
                if key is None and legacy is not None:
                    legacy(step, folder)
                    out.step, out.folder = step, folder
                    return out
                raise ManifestError("no manifest")
            entries = check(raw, job_id=job_id, step=step, key=key)
            for name, entry in entries.items():
                download(step, name, folder / name, entry.size)
            verify_files(folder, entries)
        except ManifestError as exc:
            out.skipped.append(f"checkpoint-{step}: {exc}")
            _remove(folder)
            continue
        out.step, out.folder = step, folder
        return out
    return out


def fetch_pinned(
    points: list[tuple[str, int, str]],
    *,
    read: Callable[[str, str, int], bytes | None],
    download: Callable[[str, str, Path, int], None],
    job_id: str,
) -> Fetched:
    """Download the first of ``points`` ((checkpoint uri, step, manifest SHA-256), newest first) whose
    manifest hashes to its pinned digest and whose files all match it. ``read(uri, name, limit)`` and
    ``download(uri, name, into, size)`` as in ``fetch_verified`` but by the checkpoint's URI."""
    out = Fetched()
    for uri, step, pinned in points:
        folder = Path(tempfile.mkdtemp(prefix=f"tunebot-resume-{step}-"))
        try:
            raw = read(uri, MANIFEST_FILE, MAX_MANIFEST_BYTES + 1)
            if raw is None:
                raise ManifestError("no manifest")
            entries = check(raw, job_id=job_id, step=step, key=None, pinned=pinned)
            for name, entry in entries.items():
                download(uri, name, folder / name, entry.size)
            verify_files(folder, entries)
        except ManifestError as exc:
            out.skipped.append(f"{uri.rstrip('/').rsplit('/', 1)[-1]}: {exc}")
            _remove(folder)
            continue
        except OSError as exc:  # not readable with this run's credentials, or gone
            out.skipped.append(f"{uri.rstrip('/').rsplit('/', 1)[-1]}: {type(exc).__name__}")
            _remove(folder)
            continue
        out.step, out.folder, out.uri = step, folder, uri
        return out
    return out


# ---- the output folder ------------------------------------------------------------------------------------

OUTPUT_MANIFEST = "manifest.json"
MAX_OUTPUT_FILES = 10_000


def safe_relative(name: str) -> bool:
    """A relative POSIX path of plain names (``merged/model.safetensors``): no '..', no absolute path."""
    parts = name.split("/")
    return 0 < len(parts) <= 4 and all(SAFE_NAME.match(p) for p in parts)


def build_output(folder: Path, *, job_id: str, run_id: str | None, key: bytes | None) -> dict[str, Any]:
    """The signed manifest of an output folder: every file under it (but the manifest) by relative path."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name == OUTPUT_MANIFEST:
            continue
        if not safe_relative(name):
            raise ValueError(f"output file name {name!r} is not a plain relative path")
        files[name] = {"size": path.stat().st_size, "sha256": digest(path)}
    body = {"version": 1, "kind": "output", "job_id": job_id, "run_id": run_id, "files": files}
    return sign(key, OUTPUT, body)


def check_output(raw: bytes, *, job_id: str, pinned: str, key: bytes | None = None) -> dict[str, Entry]:
    """The files an output manifest vouches for: its bytes must hash to ``pinned`` (the digest the bot
    recorded from the run's signed terminal event) and, with ``key``, carry that run's MAC."""
    if len(raw) > 4 * MAX_MANIFEST_BYTES or sha256_of(raw) != pinned:
        raise ManifestError("output manifest is not the one its run reported")
    try:
        obj = json.loads(raw)
    except ValueError:
        raise ManifestError("output manifest is not JSON") from None
    if not isinstance(obj, dict) or obj.get("kind") != "output" or obj.get("job_id") != job_id:
        raise ManifestError("not this job's output manifest")
    if key is not None and not verify(key, OUTPUT, obj):
        raise ManifestError("output manifest not signed with its run's key")
    files = obj.get("files")
    if not isinstance(files, dict) or not files or len(files) > MAX_OUTPUT_FILES:
        raise ManifestError("output manifest lists no files")
    out: dict[str, Entry] = {}
    for name, entry in files.items():
        if not isinstance(name, str) or not safe_relative(name) or name == OUTPUT_MANIFEST:
            raise ManifestError(f"output manifest names {name!r}, not a plain relative path")
        size = entry.get("size") if isinstance(entry, dict) else None
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"output manifest size of {name} is not a size")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ManifestError(f"output manifest hash of {name} is not a SHA-256")
        out[name] = Entry(size, sha)
    return out


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
