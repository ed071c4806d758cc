"""The relay as a loop: replicas side by side, NOTIFY wake-ups, and surviving errors."""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest
from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool
from relay_harness import Queues, Rows, TcpForwarder, task_ids_of

from taskplat.common.clock import FakeClock
from taskplat.common.db.pools import make_pool
from taskplat.common.sqs import sqs_client
from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.outbox_relay.relay import Relay, RelayBatch
from taskplat.outbox_relay.settings import RelaySettings


def _in_thread(target: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("relay_overrides", [{"batch_size": 25}])
def test_two_relays_share_the_outbox_and_send_each_row_once(
    settings: RelaySettings, rows: Rows, queues: Queues, clock: FakeClock
) -> None:
    url = queues.create("bulk")
    expected = set(rows.queued_tasks("bulk", 500))
    pools: list[ConnectionPool[Connection[DictRow]]] = []
    relays: list[Relay] = []
    for index in range(2):
        pool = make_pool(settings, application_name=f"relay-{index}")
        pool.open(wait=True, timeout=10)
        pools.append(pool)
        relays.append(Relay(settings, pool=pool, sqs=sqs_client(settings), clock=clock))
    start = threading.Barrier(2)
    batches: list[list[RelayBatch]] = [[], []]
    errors: list[BaseException] = []

    def drain(index: int) -> None:
        try:
            start.wait(timeout=10)
            while (batch := relays[index].run_once()).claimed:
                batches[index].append(batch)
        except BaseException as exc:
            errors.append(exc)

    threads = [_in_thread(functools.partial(drain, i), f"relay-{i}") for i in range(2)]
    try:
        for thread in threads:
            thread.join(timeout=120)
        assert not errors
        assert not any(thread.is_alive() for thread in threads)
    finally:
        for relay, pool in zip(relays, pools, strict=True):
            relay.close()
            pool.close()

    claimed = [sum(batch.claimed for batch in mine) for mine in batches]
    assert sum(claimed) == 500
    assert all(count > 0 for count in claimed), claimed
    assert sum(batch.sent for mine in batches for batch in mine) == 500
    outbox = rows.outbox()
    assert len(outbox) == 500
    assert all(row["sent_at"] == clock.now() and row["send_attempts"] == 1 for row in outbox)

    received = task_ids_of(queues.receive(url, 500, timeout=60))
    assert len(received) == 500  # SKIP LOCKED: no row was sent twice
    assert set(received) == expected


@pytest.mark.parametrize("relay_overrides", [{"interval_seconds": 30.0}])
def test_a_notify_wakes_the_loop_long_before_the_interval(
    relay: Relay, rows: Rows, queues: Queues
) -> None:
    url = queues.create("default")
    stop = threading.Event()
    thread = _in_thread(lambda: relay.run(stop), "relay-loop")
    try:
        # The loop ran its first (empty) batch and now listens, waiting up to 30 s.
        wait_for(lambda: relay.health.batches >= 1, timeout=10, what="the first batch")
        wait_for(lambda: rows.listeners() >= 1, timeout=10, what="the relay to LISTEN")

        [task_id] = rows.queued_tasks("default", 1, notify=True)

        wait_for(
            lambda: rows.by_task()[task_id]["sent_at"] is not None,
            timeout=3,
            what="the notified row to be sent",
        )
        assert task_ids_of(queues.receive(url, 1)) == [task_id]
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_loop_survives_an_unreachable_sqs_endpoint_and_a_lost_database_connection(
    settings: RelaySettings,
    pool: ConnectionPool[Connection[DictRow]],
    rows: Rows,
    queues: Queues,
    clock: FakeClock,
) -> None:
    url = queues.create("default")
    port = free_port()
    down = settings.model_copy(update={"sqs_endpoint_url": f"http://127.0.0.1:{port}"})
    relay = Relay(settings, pool=pool, sqs=sqs_client(down), clock=clock, rand=random.Random(3))
    task_ids = rows.queued_tasks("default", 3)
    stop = threading.Event()
    thread = _in_thread(lambda: relay.run(stop), "relay-loop")
    forwarder: TcpForwarder | None = None
    try:
        # SQS is unreachable: the rows are pushed back with the error, the loop goes on.
        wait_for(
            lambda: all(row["send_attempts"] == 1 for row in rows.outbox()),
            timeout=60,
            what="the failed sends to be recorded",
        )
        for row in rows.outbox():
            assert row["sent_at"] is None
            assert row["last_error"].startswith(
                f"sending to SQS queue {queues.name('default')} failed: Could not connect"
            )
        # The database connection dies under the loop: that batch fails, the next one works.
        assert rows.terminate("relay-test") >= 1
        wait_for(lambda: relay.health.errors >= 1, timeout=10, what="the failed batch")
        batches = relay.health.batches
        wait_for(lambda: relay.health.batches > batches, timeout=15, what="a batch after it")

        # SQS comes back: once the rows are due again they go out.
        endpoint = urlsplit(settings.sqs_endpoint_url or "")
        forwarder = TcpForwarder(port, (endpoint.hostname or "", endpoint.port or 80))
        clock.advance(settings.retry_max_seconds)
        wait_for(
            lambda: all(row["sent_at"] is not None for row in rows.outbox()),
            timeout=30,
            what="the rows to be sent once SQS is back",
        )
        assert sorted(task_ids_of(queues.receive(url, 3))) == sorted(task_ids)
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=10)
        relay.close()
        if forwarder is not None:
            forwarder.close()
    assert not thread.is_alive()
    assert all(row["send_attempts"] == 2 for row in rows.outbox())
