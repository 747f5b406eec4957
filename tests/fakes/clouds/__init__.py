"""Fake cloud API servers on 127.0.0.1, reusable by any test area and the benches.

Import as ``from fakes.clouds import FakeVast`` inside pytest (``tests/`` is on sys.path) or as
``tests.fakes.clouds`` from the repository root.
"""

from __future__ import annotations

from .base import FAULT_KINDS, FakeCloud, Request, Response
from .lambda_cloud import FakeLambda
from .runpod import FakeRunPod
from .tensordock import FakeTensorDock
from .vast import FakeVast

FAKES: dict[str, type[FakeCloud]] = {
    "vast": FakeVast,
    "runpod": FakeRunPod,
    "lambda": FakeLambda,
    "tensordock": FakeTensorDock,
}

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
