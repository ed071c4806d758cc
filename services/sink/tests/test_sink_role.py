"""The sink's database role against a real Postgres: a login user that is only a member of
`taskplat_sink` runs the sink end to end (queues recorded, rows written, the event stored through
its function) and can read or change nothing else of the platform's."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from taskplat.common.db.pools import make_pool
from taskplat.common.sqs import sqs_client
from taskplat.devstack.waiting import wait_for
from taskplat.sink.sink import Sink
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.sink_harness import (
    body,
    buffered_dag,
    dataset_events,
    make_settings,
    publish,
    record,
)

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient


@pytest.fixture
def sink_user_url(db_url: str) -> Iterator[str]:
    user = f"sink_test_{secrets.token_hex(4)}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'sink-test' IN ROLE taskplat_sink").format(
                sql.Identifier(user)
            )
        )
    yield make_conninfo(db_url, user=user, password="sink-test")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))


def test_the_sink_role_writes_dataset_tables_and_nothing_else(
    dispatcher: Dispatcher, sink_user_url: str, sqs_endpoint_url: str, db_url: str,
) -> None:  # fmt: skip
    assert dispatcher.api.put("/dags/alerts", json=buffered_dag()).status_code == 201
    settings = make_settings(sink_user_url, sqs_endpoint_url)
    pool = make_pool(settings, application_name="sink-role-test")
    pool.open(wait=True, timeout=10)
    sink = Sink(settings, pool=pool, sqs=sqs_client(settings))
    sqs: SQSClient = sqs_client(settings)
    try:
        (buffer,) = sink.discover()
        (listed,) = dispatcher.api.get("/datasets").json()["datasets"]
        view: dict[str, Any] = dispatcher.api.get(f"/datasets/{listed['dataset_uuid']}").json()
        assert view["buffer_queue_url"] == buffer.queue_url
        publish(sqs, buffer.queue_url, [body(view, [record("a"), record("b")])])
        written: Callable[[], bool] = lambda: sink.run_once().written == 2  # noqa: E731
        wait_for(written, timeout=20, what="two rows written by the sink's role")
        assert [e["cursor"] for e in dataset_events(db_url, view["dataset_uuid"])] == [2]
    finally:
        sink.close()
        pool.close()
    table = view["location"].removeprefix("postgres_table:")
    refused = [
        "SELECT * FROM tasks",
        "SELECT * FROM outbox",
        "SELECT * FROM dataset_tables",
        "UPDATE datasets SET name = name",
        "DELETE FROM dataset_buffers",
        "CREATE TABLE sink_was_here (a int)",
        "INSERT INTO task_events (task_id, attempt, dataset_uuid, dataset_version, created_at) "
        "VALUES (gen_random_uuid(), 1, gen_random_uuid(), gen_random_uuid(), now())",
        sql.SQL("DELETE FROM {}").format(sql.Identifier(table)),
        sql.SQL("ALTER TABLE {} ADD COLUMN x int").format(sql.Identifier(table)),
    ]
    with psycopg.connect(sink_user_url, autocommit=True) as conn:
        for statement in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[arg-type]
