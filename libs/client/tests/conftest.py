"""Fixtures of the client's tests: a real dispatcher (the dispatcher tests' harness) on a fresh
database, which the client and the `taskplat` command talk to over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher


@pytest.fixture
def dispatcher(db_url: str) -> Iterator[Dispatcher]:
    with serve_dispatcher(db_url) as served:
        yield served
