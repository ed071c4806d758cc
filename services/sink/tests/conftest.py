"""Fixtures of the sink tests (helpers in `taskplat.testkit.sink_harness`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.db.pools import make_pool
from taskplat.common.sqs import sqs_client
from taskplat.common.telemetry import Telemetry
from taskplat.sink.settings import SinkSettings
from taskplat.sink.sink import Sink
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.sink_harness import buffered_dag, make_settings

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient


@pytest.fixture
def settings(db_url: str, sqs_endpoint_url: str) -> SinkSettings:
    return make_settings(db_url, sqs_endpoint_url)


@pytest.fixture
def pool(settings: SinkSettings) -> Iterator[ConnectionPool[Connection[DictRow]]]:
    pool = make_pool(settings, application_name="sink-test")
    pool.open(wait=True, timeout=10)
    yield pool
    pool.close()


@pytest.fixture
def sqs(settings: SinkSettings) -> SQSClient:
    return sqs_client(settings)


@pytest.fixture
def make_sink(
    settings: SinkSettings, pool: ConnectionPool[Connection[DictRow]]
) -> Iterator[Callable[..., Sink]]:
    made: list[Sink] = []

    def make(telemetry: Telemetry | None = None) -> Sink:
        sink = Sink(settings, pool=pool, sqs=sqs_client(settings), telemetry=telemetry)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        sink.close()


@pytest.fixture
def dispatcher(db_url: str) -> Iterator[Dispatcher]:
    with serve_dispatcher(db_url) as served:
        yield served


@pytest.fixture
def dataset(dispatcher: Dispatcher, make_sink: Callable[..., Sink]) -> dict[str, Any]:
    """A buffered dataset (DAG `alerts`) whose buffer the sink has created: its view."""
    response = dispatcher.api.put("/dags/alerts", json=buffered_dag())
    assert response.status_code == 201, response.text
    (listed,) = dispatcher.api.get("/datasets").json()["datasets"]
    make_sink().discover()
    view: dict[str, Any] = dispatcher.api.get(f"/datasets/{listed['dataset_uuid']}").json()
    assert view["buffer_queue_url"] is not None
    return view
