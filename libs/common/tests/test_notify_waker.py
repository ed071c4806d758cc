"""`SharedNotifyWaker` on a real Postgres: one LISTEN connection, each notification wakes one
waiting loop, a notification nobody waited for is kept (at most one per loop), and `stop` ends
every wait."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator

import psycopg
import pytest

from taskplat.common.db.notify import SharedNotifyWaker
from taskplat.devstack.waiting import wait_for

_channels = itertools.count()


@pytest.fixture
def channel() -> str:
    return f"tp_waker_{os.getpid()}_{next(_channels)}"


@pytest.fixture
def stop() -> threading.Event:
    return threading.Event()


@pytest.fixture
def shared(database_url: str, channel: str, stop: threading.Event) -> Iterator[SharedNotifyWaker]:
    shared = SharedNotifyWaker(database_url, channel, stop, loops=2)
    yield shared
    stop.set()
    shared.close()


def notify(database_url: str, channel: str, times: int = 1) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for index in range(times):
            conn.execute("SELECT pg_notify(%s, %s)", (channel, str(index)))


def listening(database_url: str, channel: str) -> bool:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            # `idle`: the LISTEN has finished (committed); while it runs, a NOTIFY is not heard.
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'idle'",
            (f'LISTEN "{channel}"',),
        ).fetchone()
    return row is not None and row[0] >= 1


def test_a_notification_wakes_one_waiting_loop_not_both(
    shared: SharedNotifyWaker, database_url: str, channel: str, stop: threading.Event
) -> None:
    wait_for(lambda: listening(database_url, channel), timeout=10, what="the LISTEN")
    results: list[bool] = []
    lock = threading.Lock()

    def loop() -> None:
        woken = shared.wait(60)
        with lock:
            results.append(woken)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    notify(database_url, channel)
    wait_for(lambda: results == [True], timeout=10, what="one loop woken")
    stop.set()  # ends the other wait at once, unwoken
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(results) == [False, True]


def test_notifications_nobody_waited_for_are_kept_one_per_loop(
    shared: SharedNotifyWaker, database_url: str, channel: str
) -> None:
    wait_for(lambda: listening(database_url, channel), timeout=10, what="the LISTEN")
    notify(database_url, channel, times=5)
    wait_for(lambda: shared.pending == 2, timeout=10, what="two kept notifications")
    assert [shared.wait(0), shared.wait(0), shared.wait(0)] == [True, True, False]


def test_close_is_idempotent_once_stopped(shared: SharedNotifyWaker, stop: threading.Event) -> None:
    stop.set()
    assert shared.wait(30) is False
    shared.close()  # as each loop does when it ends
    shared.close()
