"""Fixtures of the reaper tests (rows helpers live in `taskplat.testkit.loops_rows`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from taskplat.common.clock import FakeClock
from taskplat.common.telemetry import Telemetry
from taskplat.reaper.reaper import Reaper
from taskplat.reaper.settings import ReaperSettings
from taskplat.testkit.loops_rows import LoopRows, open_pool


class FixedRandom(random.Random):
    """A `random.Random` whose every draw is `value`: retry delays become exact."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rows(db_url: str) -> Iterator[LoopRows]:
    helper = LoopRows(db_url)
    yield helper
    helper.close()


def reaper_settings(db_url: str, **overrides: object) -> ReaperSettings:
    values: dict[str, object] = {
        "database_url": db_url,
        "db_pool_min_size": 1,
        "db_pool_max_size": 2,
    }
    values.update(overrides)
    return ReaperSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def make_reaper(db_url: str, clock: FakeClock) -> Iterator[Callable[..., Reaper]]:
    """Build reapers over the test database, each with its own pool (a replica each); the
    jitter of every retry delay is 0.5 unless `rand` is given; no telemetry unless given."""
    with ExitStack() as stack:

        def make(
            *,
            rand: random.Random | None = None,
            telemetry: Telemetry | None = None,
            **overrides: object,
        ) -> Reaper:
            settings = reaper_settings(db_url, **overrides)
            pool = stack.enter_context(open_pool(settings, "reaper-test"))
            return Reaper(
                pool, settings, clock=clock, rand=rand or FixedRandom(0.5), telemetry=telemetry
            )

        yield make
