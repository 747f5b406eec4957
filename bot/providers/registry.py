"""Which providers exist: a plain dict of classes, and the set of ready clients for the settings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.providers.base import Provider
from bot.providers.lambda_cloud import LambdaProvider
from bot.providers.local import LocalProvider
from bot.providers.runpod import RunPodProvider
from bot.providers.tensordock import TensorDockProvider
from bot.providers.vast import VastProvider

if TYPE_CHECKING:
    from bot.settings import Settings

PROVIDER_CLASSES: dict[str, type[Any]] = {
    "vast": VastProvider,
    "runpod": RunPodProvider,
    "lambda": LambdaProvider,
    "tensordock": TensorDockProvider,
    "local": LocalProvider,
}

_KEY_FIELDS = {
    "vast": "vast_api_key",
    "runpod": "runpod_api_key",
    "lambda": "lambda_api_key",
    "tensordock": "tensordock_api_key",
}


def configured_clouds(settings: Settings) -> list[str]:
    """The clouds whose API key is set."""
    return [name for name, fieldname in _KEY_FIELDS.items() if getattr(settings, fieldname, None) is not None]


def build_providers(
    settings: Settings | None = None,
    *,
    local_workdir: str | Path | None = None,
    include_local: bool | None = None,
    local_options: dict[str, Any] | None = None,
) -> dict[str, Provider]:
    """Every cloud whose key is set, plus "local" (the embedded default) unless ``include_local`` is False;
    None follows TUNEBOT_LOCAL_PROVIDER (on unless set to false; `tunebot serve` passes it explicitly)."""
    if settings is None:
        from bot.settings import get_settings

        settings = get_settings()
    if include_local is None:
        include_local = settings.local_provider is not False
    providers: dict[str, Provider] = {}
    for name in configured_clouds(settings):
        providers[name] = PROVIDER_CLASSES[name].from_settings(settings)
    if include_local:
        workdir = Path(local_workdir) if local_workdir else settings.data_dir / "local-provider"
        providers["local"] = LocalProvider(workdir=workdir, **(local_options or {}))
    return providers
