"""Fixtures of the scheduler tests (rows helpers live in `taskplat.testkit.loops_rows`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from taskplat.common.clock import FakeClock
from taskplat.common.telemetry import Telemetry
from taskplat.scheduler.scheduler import Scheduler
from taskplat.scheduler.settings import SchedulerSettings
from taskplat.testkit.loops_rows import LoopRows, open_pool

MakeScheduler = Callable[..., Scheduler]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rows(db_url: str) -> Iterator[LoopRows]:
    helper = LoopRows(db_url)
    yield helper
    helper.close()


def scheduler_settings(db_url: str, **overrides: object) -> SchedulerSettings:
    values: dict[str, object] = {
        "database_url": db_url,
        "db_pool_min_size": 1,
        "db_pool_max_size": 2,
    }
    values.update(overrides)
    return SchedulerSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
def make_scheduler(db_url: str, clock: FakeClock) -> Iterator[MakeScheduler]:
    """Build schedulers over the test database, each with its own pool (a replica each), with
    the given `telemetry` or none."""
    with ExitStack() as stack:

        def make(*, telemetry: Telemetry | None = None, **overrides: object) -> Scheduler:
            settings = scheduler_settings(db_url, **overrides)
            pool = stack.enter_context(open_pool(settings, "scheduler-test"))
            return Scheduler(pool, settings, clock=clock, telemetry=telemetry)

        yield make
