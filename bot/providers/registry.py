"""Which clouds exist (``CLOUDS``, an explicit table), their keys from the environment, the providers built.

Each cloud module ends with ``CLOUD = CloudSpec(...)`` (bot/providers/spec.py); ``CLOUDS`` below lists those
specs, one line per cloud. Everything else takes the cloud set from this table: the live catalog asks the
clouds in it, the snapshot (bot/providers/snapshot.py) prices them, docs/configuration.md lists their
variables, the tests start a fake server for each. The cloud variables (``spec.key_env``, ``spec.url_env`` and
``spec.options``) are read here, from the environment then ``.env``; bot/settings.py knows no cloud.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from bot.providers import lambda_cloud, runpod, tensordock, vast
from bot.providers.base import Provider
from bot.providers.local import LocalProvider, runner_missing
from bot.providers.spec import CloudAccess, CloudSpec

if TYPE_CHECKING:
    from bot.settings import Settings

log = logging.getLogger(__name__)

# The clouds, by the provider name offers and jobs carry (module-name order). A new cloud: its module in
# bot/providers/, its fake in tests/fakes/clouds/, and its CLOUD on one line here (with its import above).
CLOUDS: dict[str, CloudSpec] = {
    spec.name: spec
    for spec in (
        lambda_cloud.CLOUD,
        runpod.CLOUD,
        tensordock.CLOUD,
        vast.CLOUD,
    )
}


def cloud_spec(name: str) -> CloudSpec:
    try:
        return CLOUDS[name]
    except KeyError:
        raise KeyError(f"no cloud named {name!r} in CLOUDS (bot/providers/registry.py)") from None


def key_env(name: str) -> str:
    """The environment variable that enables a cloud (VAST_API_KEY, ...)."""
    spec = CLOUDS.get(name)
    return spec.key_env if spec else f"{name.upper()}_API_KEY"


def provider_classes() -> dict[str, type[Any]]:
    """Every provider class by name: the clouds, then "local"."""
    return {**{name: spec.client for name, spec in CLOUDS.items()}, "local": LocalProvider}


def _dotenv() -> dict[str, str | None]:
    from bot.settings import ENV_FILE

    if not Path(ENV_FILE).is_file():
        return {}
    from dotenv import dotenv_values

    return dict(dotenv_values(ENV_FILE))


def cloud_access(environ: Mapping[str, str] | None = None) -> dict[str, CloudAccess]:
    """Every cloud's variables, from the environment, then ``.env`` (as bot/settings.py reads its own)."""
    sources: tuple[Mapping[str, str | None], ...] = (os.environ if environ is None else environ, _dotenv())

    def value(name: str) -> str | None:
        for source in sources:
            found = source.get(name)
            if found not in (None, ""):
                return str(found)
        return None

    access = {}
    for name, spec in CLOUDS.items():
        key = value(spec.key_env)
        access[name] = CloudAccess(
            api_key=SecretStr(key) if key is not None else None,
            api_url=value(spec.url_env) or spec.default_url,
            options={kw: v for kw, env in spec.options.items() if (v := value(env)) is not None},
        )
    return access


def configured_clouds() -> list[str]:
    """The clouds whose API key is set."""
    return [name for name, access in cloud_access().items() if access.api_key is not None]


def secrets(settings: Settings) -> list[str]:
    """Every secret value the bot holds, the cloud keys included, for scrubbing logs and messages."""
    keys = [a.api_key.get_secret_value() for a in cloud_access().values() if a.api_key is not None]
    return [*keys, *settings.secrets()]


def build_providers(
    settings: Settings | None = None,
    *,
    local_workdir: str | Path | None = None,
    include_local: bool | None = None,
    local_options: dict[str, Any] | None = None,
) -> dict[str, Provider]:
    """Every cloud whose key is set, plus "local" (the embedded default) unless ``include_local`` is False;
    None follows TUNEBOT_LOCAL_PROVIDER (on unless set to false; `tunebot serve` passes it explicitly). Local
    only where the runner can start (``local_unavailable``): a bot-only install offers no CPU jobs."""
    if settings is None:
        from bot.settings import get_settings

        settings = get_settings()
    if include_local is None:
        include_local = settings.local_provider is not False
    providers: dict[str, Provider] = {}
    for name, access in cloud_access().items():
        if access.api_key is not None:
            providers[name] = CLOUDS[name].client.from_spec(CLOUDS[name], access, settings)
    missing = local_unavailable() if include_local else None
    if missing is not None:
        log.warning("local provider off: the runner cannot start on this machine: %s", missing)
    if include_local and missing is None:
        workdir = Path(local_workdir) if local_workdir else settings.data_dir / "local-provider"
        providers["local"] = LocalProvider(workdir=workdir, **(local_options or {}))
    return providers


def watch_only_providers(
    settings: Settings, offered: dict[str, Provider], *, local_workdir: str | Path | None = None
) -> dict[str, Provider]:
    """The providers a process supervises without offering them for new jobs: this machine's runners when
    the local provider is off here (a Slack `tunebot serve`, a bot-only install). The CLI on the same store
    and data folder may have launched local jobs; stopping, observing and tearing them down needs only the
    local provider's state file and the processes' pids, not the runner's libraries."""
    if "local" in offered:
        return {}
    workdir = Path(local_workdir) if local_workdir else settings.data_dir / "local-provider"
    return {"local": LocalProvider(workdir=workdir)}


def local_unavailable() -> str | None:
    """Why this machine's CPU is not offered although the local provider is on: the runner's libraries are
    missing here (bot/providers/local.runner_missing), or None."""
    return runner_missing()
