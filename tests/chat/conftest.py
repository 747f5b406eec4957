"""Fixtures for the chat layer's tests."""

from __future__ import annotations

import pytest

from .fake_engine import FakeEngine


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()
