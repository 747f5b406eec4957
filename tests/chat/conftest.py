"""Fixtures for the chat layer's tests: the FakeEngine, the whole Slack stack on loopback (built by
tests/fakes/worlds.py), and one tiny model for the tests that train it.

``slack_stack`` = fake Slack Web API server + FakeEngine + ChatHandlers + AsyncApp + SlackNotifier + App Home,
served by bot.web under real uvicorn on 127.0.0.1; ``SlackStack.command()`` / ``.click()`` send correctly
signed requests like Slack does. ``real_stack`` = the same on the real Engine with an in-memory cloud.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine.fakes import FakeProvider
from fakes.worlds import SlackStack, engine_slack_world, slack_world

from .fake_engine import FakeEngine


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def slack_stack(engine: FakeEngine) -> Iterator[SlackStack]:
    """``engine`` (a FakeEngine unless a test gives its own) behind the whole Slack app, U_ADMIN its admin."""
    with slack_world(engine) as stack:
        yield stack


@pytest.fixture
def real_stack(tmp_path: Path) -> Iterator[tuple[SlackStack, object, FakeProvider]]:
    """The Slack app on the real Engine (SQLite, real planner; the test's dataset files in ``tmp_path``) with
    one in-memory cloud, vast at $0.40/h: (stack, engine, cloud)."""
    cloud = FakeProvider("vast", price=0.40)
    with engine_slack_world(tmp_path, {"vast": cloud}) as stack:
        yield stack, stack.engine, cloud


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model and dataset (runner.tiny.make_tiny, seed 0) for every test that trains it and only reads
    it: made once, the suite stays fast. Its folder holds model/ and data.jsonl."""
    from runner.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=0).parent
