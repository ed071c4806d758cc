"""Fixtures of the dispatcher tests (the harness is `taskplat.testkit.dispatcher_harness`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    """Override in a test module to change dispatcher settings."""
    return {}


@pytest.fixture
def dispatcher(db_url: str, dispatcher_overrides: dict[str, object]) -> Iterator[Dispatcher]:
    with serve_dispatcher(db_url, **dispatcher_overrides) as served:
        yield served
