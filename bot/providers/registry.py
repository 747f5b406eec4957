"""Which providers exist: every module of this package that declares ``CLOUD``, plus the local provider.

Discovery is a scan of the package's folder(s) (like SkyPilot's sky/provision/<cloud>/): a cloud module
ends with ``CLOUD = CloudSpec(...)`` (bot/providers/spec.py) and nothing else needs to know about it:
settings read its key from ``spec.key_env``, the live catalog asks it, the snapshot prices it, the
contract test runs against it.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bot.providers as package
from bot.providers.base import Provider
from bot.providers.local import LocalProvider
from bot.providers.spec import CloudSpec

if TYPE_CHECKING:
    from bot.settings import Settings

_found: tuple[tuple[str, ...], dict[str, CloudSpec]] | None = None
_lock = threading.Lock()


def cloud_specs() -> dict[str, CloudSpec]:
    """Every cloud's spec by name, in module-name order; rescanned when the package's folders change."""
    global _found
    folders = tuple(str(p) for p in package.__path__)
    with _lock:
        if _found is None or _found[0] != folders:
            specs: dict[str, CloudSpec] = {}
            for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
                if module.name.startswith("_") or module.ispkg:
                    continue
                spec = getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "CLOUD", None)
                if isinstance(spec, CloudSpec):
                    specs[spec.name] = spec
            _found = (folders, specs)
        return dict(_found[1])


def cloud_spec(name: str) -> CloudSpec:
    try:
        return cloud_specs()[name]
    except KeyError:
        raise KeyError(f"no cloud module declares {name!r}") from None


def cloud_names() -> list[str]:
    return list(cloud_specs())


def key_env(name: str) -> str:
    """The environment variable that enables a cloud (VAST_API_KEY, ...)."""
    spec = cloud_specs().get(name)
    return spec.key_env if spec else f"{name.upper()}_API_KEY"


def provider_classes() -> dict[str, type[Any]]:
    """Every provider class by name: the discovered clouds, then "local"."""
    return {**{name: spec.client for name, spec in cloud_specs().items()}, "local": LocalProvider}


def __getattr__(name: str) -> Any:  # PEP 562: PROVIDER_CLASSES follows discovery
    if name == "PROVIDER_CLASSES":
        return provider_classes()
    raise AttributeError(name)


def configured_clouds(settings: Settings) -> list[str]:
    """The clouds whose API key is set."""
    return [name for name, access in settings.clouds.items() if access.api_key is not None]


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
        providers[name] = cloud_spec(name).client.from_settings(settings)
    if include_local:
        workdir = Path(local_workdir) if local_workdir else settings.data_dir / "local-provider"
        providers["local"] = LocalProvider(workdir=workdir, **(local_options or {}))
    return providers
