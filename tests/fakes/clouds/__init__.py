"""Fake cloud API servers on 127.0.0.1, reusable by any test area and the benches.

Import as ``from fakes.clouds import FakeVast`` inside pytest (``tests/`` is on sys.path) or as
``tests.fakes.clouds`` from the repository root. ``FAKES`` maps each cloud to its fake: every module of
this folder is scanned for FakeCloud subclasses, so a new cloud's fake is one more file here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from .base import FAULT_KINDS, FakeCloud, Request, Response
from .lambda_cloud import FakeLambda
from .runpod import FakeRunPod
from .tensordock import FakeTensorDock
from .vast import FakeVast


def discover_fakes() -> dict[str, type[FakeCloud]]:
    """Every fake cloud server in this folder, by the provider name it emulates (module-name order)."""
    found: dict[str, type[FakeCloud]] = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name in ("base", "fixtures"):
            continue
        mod = importlib.import_module(f"{__name__}.{module.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, FakeCloud) and cls.__module__ == mod.__name__ and cls.provider != "cloud":
                found[cls.provider] = cls
    return found


FAKES: dict[str, type[FakeCloud]] = discover_fakes()

__all__ = [
    "FAKES",
    "FAULT_KINDS",
    "FakeCloud",
    "FakeLambda",
    "FakeRunPod",
    "FakeTensorDock",
    "FakeVast",
    "Request",
    "Response",
]
