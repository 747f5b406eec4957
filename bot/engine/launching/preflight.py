"""Before renting: what would keep a rented host from starting, checked from here while it costs nothing.

A host that cannot start the runner still bills. So when a job is created, before any provider is asked
for an instance (bot/engine/control/jobs.py):

- the image hosts start (a team's prebuilt runner image, TUNEBOT_RUNNER_IMAGE, else the public stock PyTorch
  image, TUNEBOT_STOCK_IMAGE, on which the runner is installed at start:
  bot/engine/launching/runner_bundle.py) is looked up in its registry with the OCI distribution API (token
  endpoint, then ``HEAD /v2/<name>/manifests/<tag>``; anonymous, or with TUNEBOT_REGISTRY_USERNAME/PASSWORD):
  an image that was never pushed, or that the registry will not serve, refuses the launch;
- a Hugging Face model is fetched the way the runner will fetch it, with the token the host gets
  (TUNEBOT_HF_READ_TOKEN, never the bot's HF_TOKEN: bot/engine/launching/instance_env.py) (``HEAD
  <endpoint>/<repo>/resolve/main/config.json``): a gated model the token's account has not accepted, a
  repository that does not exist or a rejected token refuses the launch;
- the storage credentials the runner will get write, read back and delete a probe object under the job's
  own prefix of TUNEBOT_CHECKPOINT_URI: bad keys or a missing bucket refuse the launch.

Each refusal says what to fix. A check that cannot reach its service (the registry or the Hub down, or not
reachable from the bot) does not refuse: the job goes ahead with a note saying what was not checked, and
the first-start deadline bounds what a host that never starts can cost. That deadline is computed here too:
the image pull and the model download at a conservative bandwidth, plus loading and a margin.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.engine.api import EngineError
from bot.engine.launching.staging import is_local, shares_disk, storage_env
from bot.planner.models import HUB_ID
from bot.planner.result import RankedOffer
from bot.providers.base import redact
from bot.providers.registry import secrets as all_secrets

if TYPE_CHECKING:
    import httpx

    from bot.settings import Settings

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 10.0
CACHE_TTL_S = 600.0  # a positive answer is trusted this long (relaunches do not ask again)
# The first start: image pull + model download at this bandwidth, weights read at LOAD_GBS, plus a margin.
START_BANDWIDTH_MBPS = 200.0  # conservative: marketplace hosts often pull at 200-1000 Mb/s
LOAD_GBS = 0.5
START_MARGIN_S = 600.0  # boot, container start, CUDA init, tokenizing the data
START_MIN_S = 1200.0  # never less patience than before (twice the default heartbeat timeout)
UNKNOWN_IMAGE_BYTES = 5e9  # compressed; the runner image is about 4 GB
ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
NOTHING_RENTED = "Nothing was rented."


# --- the runner image ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port] as written ("docker.io" for Docker Hub)
    repository: str
    reference: str  # tag or digest

    @property
    def api(self) -> str:
        """The registry's base URL: Docker Hub's API host; plain HTTP for a registry on this machine (as
        Docker itself treats localhost)."""
        host = "registry-1.docker.io" if self.registry == "docker.io" else self.registry
        local = host.split(":")[0] in ("localhost", "127.0.0.1") or host.startswith("[::1]")
        return f"{'http' if local else 'https'}://{host}"


def parse_image(image: str) -> ImageRef:
    """Docker's reference rules: ``[registry/]name[:tag|@digest]``, Docker Hub and ``library/`` by default."""
    text = image.strip()
    if not text or any(c.isspace() for c in text):
        raise EngineError(f"TUNEBOT_RUNNER_IMAGE {image!r} is not an image reference")
    name, reference = text, "latest"
    if "@" in text:
        name, reference = text.split("@", 1)
    else:
        last = text.rsplit("/", 1)[-1]
        if ":" in last:
            name, reference = text[: -len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = "docker.io", name
    if registry == "docker.io" and "/" not in repository:
        repository = f"library/{repository}"
    return ImageRef(registry, repository, reference)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="...",scope="..."`` -> ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


@dataclass
class Check:
    """One check's answer: ok True (passed), False (refuse, ``message`` says why), None (could not tell)."""

    ok: bool | None
    message: str = ""
    size_bytes: float | None = None  # the image's compressed size, where the registry said


def _registry_error(resp: httpx.Response) -> str:
    try:
        first = (resp.json().get("errors") or [{}])[0]
        return f"{first.get('code') or resp.status_code}: {first.get('message') or ''}".strip(": ")
    except (ValueError, AttributeError, IndexError):
        return f"HTTP {resp.status_code}"


def check_image(
    image: str,
    *,
    username: str | None = None,
    password: str | None = None,
    timeout_s: float = CHECK_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> Check:
    """Is the image in its registry, and may we pull it? Its compressed size too, where the registry says."""
    import httpx

    ref = parse_image(image)
    url = f"{ref.api}/v2/{ref.repository}/manifests/{ref.reference}"
    how = f"as {username}" if username else "anonymously"
    basic = (username, password or "") if username else None
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=True, transport=transport) as http:
            headers = {"Accept": ACCEPT}
            resp = http.head(url, headers=headers)
            if resp.status_code == 401:
                scheme, params = parse_challenge(resp.headers.get("www-authenticate", ""))
                if scheme == "bearer" and params.get("realm"):
                    query = {k: v for k, v in params.items() if k in ("service", "scope")}
                    query.setdefault("scope", f"repository:{ref.repository}:pull")
                    got = http.get(params["realm"], params=query, auth=basic)
                    if got.status_code in (401, 403) and basic is not None:
                        return Check(
                            False,
                            f"the registry {ref.registry} rejected the credentials "
                            f"TUNEBOT_REGISTRY_USERNAME / TUNEBOT_REGISTRY_PASSWORD ({how}): "
                            f"fix them, or unset them to pull anonymously. {NOTHING_RENTED}",
                        )
                    if got.status_code in (401, 403):
                        return Check(
                            False,
                            f"the registry {ref.registry} wants a login to pull {image}, and "
                            "hosts pull anonymously: make the image public (or set "
                            "TUNEBOT_RUNNER_IMAGE to a public one). " + NOTHING_RENTED,
                        )
                    got.raise_for_status()
                    body = got.json()
                    token = body.get("token") or body.get("access_token")
                    headers["Authorization"] = f"Bearer {token}"
                elif scheme == "basic" and basic is not None:
                    http.auth = httpx.BasicAuth(*basic)
                resp = http.head(url, headers=headers)
            if resp.status_code == 200:
                return Check(True, size_bytes=_image_size(http, ref, headers))
            if resp.status_code not in (401, 403, 404):
                return Check(None, f"the registry {ref.registry} answered HTTP {resp.status_code}")
            resp = http.get(url, headers=headers)  # a HEAD has no body: read the registry's error code
            why = _registry_error(resp)
            fix = (
                f"build and push it (scripts/runner-image.sh {image}), or set TUNEBOT_RUNNER_IMAGE to an "
                f"image that exists. {NOTHING_RENTED}"
            )
            if resp.status_code == 404:
                where = f"{ref.registry}: {why}"
                return Check(False, f"the runner image {image} is not in its registry ({where}): {fix}")
            if resp.status_code in (401, 403):
                return Check(
                    False,
                    f"the registry {ref.registry} will not serve {image} {how} ({why}): it was never pushed, "
                    f"or it is private (hosts pull it anonymously: make it public); {fix}",
                )
            return Check(None, f"the registry {ref.registry} answered HTTP {resp.status_code}")
    except (httpx.HTTPError, OSError, ValueError) as exc:
        return Check(None, f"the registry {ref.registry} could not be reached ({type(exc).__name__})")


def _image_size(http: httpx.Client, ref: ImageRef, headers: dict[str, str]) -> float | None:
    """Sum of the linux/amd64 manifest's layers (what a host pulls), or None when it cannot be read."""
    try:
        base = f"{ref.api}/v2/{ref.repository}/manifests"
        doc = http.get(f"{base}/{ref.reference}", headers=headers).json()
        if doc.get("manifests"):  # an index: the linux/amd64 image
            pick = next(
                (
                    m
                    for m in doc["manifests"]
                    if (m.get("platform") or {}).get("architecture") == "amd64"
                    and (m.get("platform") or {}).get("os") == "linux"
                ),
                doc["manifests"][0],
            )
            doc = http.get(f"{base}/{pick['digest']}", headers=headers).json()
        layers = doc.get("layers") or []
        config = int((doc.get("config") or {}).get("size") or 0)
        return float(sum(int(x.get("size") or 0) for x in layers) + config)
    except Exception:  # noqa: BLE001 - the size only sharpens the deadline
        return None


# --- the model on the Hub -------------------------------------------------------------------------------
def is_hub_id(name: str) -> bool:
    return "://" not in name and bool(HUB_ID.match(name)) and not Path(name).expanduser().exists()


READ_TOKEN = "TUNEBOT_HF_READ_TOKEN"  # the token a host downloads with (bot/engine/launching/instance_env.py)


def check_hub_model(
    repo_id: str,
    *,
    token: str | None,
    endpoint: str | None = None,
    timeout_s: float = CHECK_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> Check:
    """Can the runner fetch this model with this token? (``config.json``, the first file it reads.)"""
    import httpx

    base = (endpoint or "https://huggingface.co").rstrip("/")
    page = f"{base}/{repo_id}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False, transport=transport) as http:
            resp = http.head(f"{page}/resolve/main/config.json", headers=headers)
    except (httpx.HTTPError, OSError) as exc:
        return Check(None, f"the Hub ({base}) could not be reached ({type(exc).__name__})")
    code = resp.headers.get("x-error-code", "")
    if resp.status_code < 400:
        return Check(True)
    if code == "GatedRepo":
        if not token:
            return Check(
                False,
                f"{repo_id} is gated: set {READ_TOKEN} to a fine-grained read-only token of an account that "
                f"accepted its license at {page} (hosts never get HF_TOKEN). {NOTHING_RENTED}",
            )
        return Check(
            False,
            f"{repo_id} is gated and {READ_TOKEN}'s account has no access yet: accept its license at {page} "
            f"with that account (or use a token that has), then launch again. {NOTHING_RENTED}",
        )
    if code == "RepoNotFound" or (resp.status_code == 404 and code != "EntryNotFound"):
        hint = "" if token else f" (a private repository needs {READ_TOKEN})"
        return Check(False, f"{repo_id} was not found on the Hub{hint}: check the model id. {NOTHING_RENTED}")
    if code == "EntryNotFound":
        return Check(False, f"{repo_id} has no config.json: the runner cannot load it. {NOTHING_RENTED}")
    if resp.status_code in (401, 403):
        return Check(
            False,
            f"the Hub rejected {READ_TOKEN} (HTTP {resp.status_code}) for {repo_id}: set a valid "
            f"token. {NOTHING_RENTED}",
        )
    return Check(None, f"the Hub answered HTTP {resp.status_code} for {repo_id}")


# --- object storage -------------------------------------------------------------------------------------
def _filesystem(uri: str, env: Mapping[str, str]) -> Any:
    """The file system of ``uri`` with exactly the credentials the runner gets (not this process's own)."""
    import fsspec

    scheme = uri.split("://", 1)[0].lower()
    if scheme in ("s3", "s3a"):
        import s3fs

        client: dict[str, str] = {}
        if env.get("AWS_ENDPOINT_URL"):
            client["endpoint_url"] = env["AWS_ENDPOINT_URL"]
        if env.get("AWS_DEFAULT_REGION"):
            client["region_name"] = env["AWS_DEFAULT_REGION"]
        return s3fs.S3FileSystem(
            key=env.get("AWS_ACCESS_KEY_ID"),
            secret=env.get("AWS_SECRET_ACCESS_KEY"),
            token=env.get("AWS_SESSION_TOKEN"),
            client_kwargs=client,
            config_kwargs={
                "connect_timeout": 5,
                "read_timeout": CHECK_TIMEOUT_S,
                "retries": {"max_attempts": 2},
            },
            skip_instance_cache=True,
        )
    return fsspec.core.url_to_fs(uri)[0]


def probe_storage(root: str, job_id: str, env: Mapping[str, str]) -> Check:
    """Write, read back and delete ``<root>/<job id>/.tunebot-probe-<random>`` with the runner's
    credentials."""
    uri = f"{root.rstrip('/')}/{job_id}/.tunebot-probe-{uuid.uuid4().hex[:8]}"
    payload = f"tunebot storage probe for job {job_id}".encode()
    step = "connect"
    try:
        fs = _filesystem(uri, env)
        path = fs._strip_protocol(uri)
        step = "write"
        fs.pipe_file(path, payload)
        step = "read back"
        if fs.cat_file(path) != payload:
            raise OSError("the object read back differs from what was written")
        step = "delete"
        fs.rm_file(path)
    except Exception as exc:  # noqa: BLE001 - any storage trouble: say which step and why
        detail = redact(f"{type(exc).__name__}: {exc}", list(env.values()))[:300]
        return Check(
            False,
            f"the runner's storage credentials cannot {step} a probe object under "
            f"{root.rstrip('/')}/{job_id}/ ({detail}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and "
            f"AWS_ENDPOINT_URL for R2, MinIO, B2) and that the bucket exists and lets them write there. "
            + NOTHING_RENTED,
        )
    return Check(True)


# --- the first start ------------------------------------------------------------------------------------
def start_deadline_s(
    image_bytes: float | None, download_gb: float, *, mbps: float = START_BANDWIDTH_MBPS
) -> float:
    """Seconds a new instance may take to start the runner: the image pull and the model download at ``mbps``,
    the weights read at LOAD_GBS, plus START_MARGIN_S; at least START_MIN_S."""
    pull_gb = (image_bytes if image_bytes is not None else UNKNOWN_IMAGE_BYTES) / 1e9
    transfer = (pull_gb + download_gb) * 8000.0 / mbps
    return round(max(START_MIN_S, START_MARGIN_S + transfer + download_gb / LOAD_GBS), 1)


def describe_deadline(seconds: float) -> str:
    return f"{seconds / 60:.0f} min (image pull + model download at {START_BANDWIDTH_MBPS:g} Mb/s + a margin)"


# --- all of it, for one job -------------------------------------------------------------------------------
@dataclass
class Preflight:
    offers: list[RankedOffer]
    notes: list[str] = field(default_factory=list)
    start_deadline_s: float | None = None


_cache: dict[tuple, float] = {}
_cache_lock = threading.Lock()


def _cached(key: tuple) -> bool:
    with _cache_lock:
        at = _cache.get(key)
    return at is not None and time.monotonic() - at < CACHE_TTL_S


def _remember(key: tuple) -> None:
    with _cache_lock:
        _cache[key] = time.monotonic()


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def check(
    settings: Settings,
    providers: Mapping[str, Any],
    *,
    base_model: str,
    chosen: RankedOffer,
    offers: list[RankedOffer],
    job_id: str,
    download_gb: float,
) -> Preflight:
    """Every check for a job about to be created; EngineError (nothing created, nothing rented) on a failure.

    A failure that concerns only the cloud fallbacks of a job chosen for this machine drops them (a note)."""
    notes: list[str] = []
    secrets = all_secrets(settings)
    remote = [o for o in offers if not shares_disk(providers.get(o.provider))]
    chosen_remote = not shares_disk(providers.get(chosen.provider))

    def refuse_remote(message: str) -> None:
        nonlocal offers, remote
        if chosen_remote:
            raise EngineError(redact(message, secrets))
        offers = [o for o in offers if shares_disk(providers.get(o.provider))]
        notes.append("cloud fallbacks dropped: " + redact(message, secrets))
        remote = []

    image_bytes: float | None = None
    if remote:
        from bot.engine.launching.runner_bundle import image_for

        image = image_for(settings)  # a team's prebuilt runner image, else the public stock image
        user = settings.registry_username
        password = settings.registry_password.get_secret_value() if settings.registry_password else None
        key = ("image", image, user)
        if not _cached(key):
            found = check_image(image, username=user, password=password)
            if found.ok is False:
                refuse_remote(found.message)
            elif found.ok is None:
                notes.append(f"runner image {image} not checked: {found.message}")
            else:
                image_bytes = found.size_bytes
                _remember(key)
    if is_hub_id(base_model):
        from bot.engine.launching.instance_env import host_read_token

        token = host_read_token(settings)  # what the host downloads with (never the bot's HF_TOKEN)
        key = ("hub", base_model, hashlib.sha256((token or "").encode()).hexdigest(), settings.hf_endpoint)
        if _offline_hub(settings):
            notes.append(f"access to {base_model} not checked: HF_HUB_OFFLINE is set and HF_ENDPOINT is not")
        elif not _cached(key):
            access = check_hub_model(base_model, token=token, endpoint=settings.hf_endpoint)
            if access.ok is False:
                raise EngineError(redact(access.message, secrets))
            if access.ok is None:
                notes.append(f"access to {base_model} not checked: {access.message}")
            else:
                _remember(key)
    root = settings.checkpoint_base_uri or ""
    if remote and root and not is_local(root) and not root.startswith("s3://"):
        from bot.engine.launching.runner_bundle import uses_stock_image

        if uses_stock_image(settings):
            refuse_remote(
                f"hosts install the runner the bot stages in object storage over the S3 API, and {root} is "
                "not: set TUNEBOT_CHECKPOINT_URI to s3://... (AWS, R2, MinIO, B2), or TUNEBOT_RUNNER_IMAGE "
                f"to an image with the runner inside (scripts/runner-image.sh). {NOTHING_RENTED}"
            )
    if remote and root and not is_local(root):
        probe = probe_storage(root, job_id, storage_env(settings))
        if probe.ok is False:
            refuse_remote(probe.message)
    deadline = start_deadline_s(image_bytes if remote else 0.0, download_gb)
    if remote:  # the runner's install on a stock image, with room for a slow package index
        from bot.engine.launching.runner_bundle import install_minutes

        deadline = round(deadline + 2 * 60 * install_minutes(settings), 1)
    for note in notes:
        log.info("job %s: %s", job_id, note)
    return Preflight(offers=offers, notes=notes, start_deadline_s=deadline)


def _offline_hub(settings: Settings) -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true") and not settings.hf_endpoint
