"""Fixtures of the relay tests (the harness lives in `relay_harness`)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool
from relay_harness import Queues, Rows, make_settings

from taskplat.common.clock import FakeClock
from taskplat.common.db.pools import make_pool
from taskplat.common.sqs import sqs_client
from taskplat.common.telemetry import Telemetry
from taskplat.outbox_relay.relay import Relay
from taskplat.outbox_relay.settings import RelaySettings


@pytest.fixture
def relay_overrides() -> dict[str, object]:
    """Override in a test module (or parametrize) to change relay settings."""
    return {}


@pytest.fixture
def settings(
    db_url: str, sqs_endpoint_url: str, relay_overrides: dict[str, object]
) -> RelaySettings:
    return make_settings(db_url, sqs_endpoint_url, **relay_overrides)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rows(db_url: str, clock: FakeClock) -> Rows:
    return Rows(db_url, clock)


@pytest.fixture
def queues(settings: RelaySettings) -> Queues:
    return Queues(settings)


@pytest.fixture
def pool(settings: RelaySettings) -> Iterator[ConnectionPool[Connection[DictRow]]]:
    pool = make_pool(settings, application_name="relay-test")
    pool.open(wait=True, timeout=10)
    yield pool
    pool.close()


@pytest.fixture
def relay(
    settings: RelaySettings, pool: ConnectionPool[Connection[DictRow]], clock: FakeClock
) -> Iterator[Relay]:
    relay = Relay(settings, pool=pool, sqs=sqs_client(settings), clock=clock, rand=random.Random(7))
    yield relay
    relay.close()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """The relay's telemetry; a module overrides it to add a span exporter."""
    telemetry = Telemetry("outbox-relay")
    yield telemetry
    telemetry.shutdown()


@pytest.fixture
def measured_relay(
    settings: RelaySettings,
    pool: ConnectionPool[Connection[DictRow]],
    clock: FakeClock,
    telemetry: Telemetry,
) -> Iterator[Relay]:
    """A relay that records its metrics and spans with the `telemetry` fixture."""
    relay = Relay(
        settings,
        pool=pool,
        sqs=sqs_client(settings),
        clock=clock,
        rand=random.Random(7),
        telemetry=telemetry,
    )
    yield relay
    relay.close()
