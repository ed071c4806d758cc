"""Heartbeat and events of the lease holder, and the fencing of every worker call: a stale
attempt or lease token is refused with 409 and the reason, and writes nothing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from uuid import uuid4

import psycopg
import pytest

from taskplat.devstack.waiting import wait_for
from taskplat.testkit.dispatcher_calls import (
    Lease,
    assert_rejected,
    claimed,
    complete,
    create_task,
    cursor_event,
    emit_events,
    heartbeat,
    output,
    partition_event,
)
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import (
    event_rows,
    promote_retry,
    reap_timeout,
    row_counts,
    task_row,
    task_state,
)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_heartbeat_extends_the_lease_from_the_clock(dispatcher: Dispatcher, db_url: str) -> None:
    ttl = timedelta(seconds=dispatcher.settings.lease_ttl_seconds)
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    first = task_row(db_url, lease.task_id)
    assert first is not None
    for step in (10, 25, 29):
        now = dispatcher.clock.advance(step)
        response = heartbeat(dispatcher, lease)
        assert response.status_code == 200, response.text
        assert response.json() == {
            "status": "Ok",
            "lease_expires_at": response.json()["lease_expires_at"],
        }
        assert ts(response.json()["lease_expires_at"]) == now + ttl
        row = task_row(db_url, lease.task_id)
        assert row is not None
        assert row["lease_expires_at"] == now + ttl
        assert row["status"] == "Running" and row["attempt"] == 1
        assert row["lease_token"] == first["lease_token"]


def _second_attempt(dispatcher: Dispatcher, db_url: str) -> tuple[Lease, Lease]:
    """A task whose attempt 1 timed out and whose attempt 2 is running: (old, current)."""
    task_id = create_task(dispatcher)["task_id"]
    old = claimed(dispatcher, task_id, "worker-old")
    now = dispatcher.clock.advance(60)
    assert reap_timeout(db_url, task_id, 1, old.lease_token, now) == "Failed"
    assert promote_retry(db_url, task_id, 1, now) == 2
    current = claimed(dispatcher, task_id, "worker-new")
    assert current.attempt == 2
    return old, current


def test_stale_attempt_and_stale_token_are_rejected_and_write_nothing(
    dispatcher: Dispatcher, db_url: str
) -> None:
    old, current = _second_attempt(dispatcher, db_url)
    wrong_token = Lease(current.task_id, current.attempt, str(uuid4()))
    old_token_now = Lease(current.task_id, current.attempt, old.lease_token)
    future_attempt = Lease(current.task_id, 3, current.lease_token)
    dataset, version = str(uuid4()), str(uuid4())
    events = [cursor_event(1, dataset, version)]
    before = task_state(db_url, current.task_id)
    counts = row_counts(db_url)
    dispatcher.clock.advance(1)

    for lease, reason in (
        (old, "StaleAttempt"),
        (future_attempt, "StaleAttempt"),
        (wrong_token, "StaleLease"),
        (old_token_now, "StaleLease"),
    ):
        assert_rejected(heartbeat(dispatcher, lease), reason)
        assert_rejected(emit_events(dispatcher, lease, events), reason)
        for status in ("Completed", "Failed", "Canceled"):
            response = complete(
                dispatcher, lease, status, outputs=[output(0)], events=events, result={"r": 1}
            )
            assert_rejected(response, reason)
    # Events name the attempt without a token too: a stale attempt is refused all the same.
    assert_rejected(emit_events(dispatcher, old, events, with_token=False), "StaleAttempt")

    assert task_state(db_url, current.task_id) == before
    assert row_counts(db_url) == counts

    # The current holder is still in charge.
    assert heartbeat(dispatcher, current).status_code == 200


def test_worker_calls_for_an_unknown_task_answer_404(dispatcher: Dispatcher, db_url: str) -> None:
    counts = row_counts(db_url)
    ghost = Lease(str(uuid4()), 1, str(uuid4()))
    assert_rejected(heartbeat(dispatcher, ghost), "NotFound", 404)
    assert_rejected(emit_events(dispatcher, ghost, [cursor_event(1)]), "NotFound", 404)
    assert_rejected(complete(dispatcher, ghost), "NotFound", 404)
    assert row_counts(db_url) == counts


def test_calls_of_an_attempt_that_ended_answer_not_running(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    assert complete(dispatcher, lease).status_code == 200
    before = task_state(db_url, lease.task_id)
    assert_rejected(heartbeat(dispatcher, lease), "NotRunning")
    assert_rejected(emit_events(dispatcher, lease, [cursor_event(1)]), "NotRunning")
    assert task_state(db_url, lease.task_id) == before


def test_events_are_stored_once_per_dataset_version_position(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    dataset, version = str(uuid4()), str(uuid4())
    batch = [
        cursor_event(10, dataset, version),
        cursor_event(20, dataset, version),
        partition_event(1000, 1999, dataset, version),
    ]
    response = emit_events(dispatcher, lease, batch)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "Accepted", "accepted": 3}

    # A repeat (at-least-once delivery) is acknowledged, not stored again; a new position is.
    again = emit_events(dispatcher, lease, [*batch, cursor_event(30, dataset, version)])
    assert again.json() == {"status": "Accepted", "accepted": 1}
    # Duplicates inside one request count once; the token is optional.
    dup = emit_events(dispatcher, lease, [cursor_event(40, dataset, version)] * 2, with_token=False)
    assert dup.json() == {"status": "Accepted", "accepted": 1}
    # Another version of the same dataset is another event.
    other = emit_events(dispatcher, lease, [cursor_event(10, dataset, str(uuid4()))])
    assert other.json() == {"status": "Accepted", "accepted": 1}

    rows = event_rows(db_url, lease.task_id)
    assert len(rows) == 6
    assert {row["attempt"] for row in rows} == {1}
    partition = next(row for row in rows if row["partition_key"] is not None)
    assert (partition["partition_key"], partition["range_start"], partition["range_end"]) == (
        "1000-1999",
        1000,
        1999,
    )
    assert partition["cursor"] is None
    assert sorted(row["cursor"] for row in rows if row["cursor"] is not None) == [
        10,
        10,
        20,
        30,
        40,
    ]


def test_events_of_a_task_that_is_not_running_are_refused(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task_id = create_task(dispatcher)["task_id"]
    queued = Lease(task_id, 1, str(uuid4()))
    counts = row_counts(db_url)
    assert_rejected(
        emit_events(dispatcher, queued, [cursor_event(1)], with_token=False), "NotRunning"
    )
    assert row_counts(db_url) == counts


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_heartbeat_waits_for_the_claim_that_is_committing(
    dispatcher: Dispatcher, db_url: str, outcome: str
) -> None:
    """A claim held open (the relay claims a Lambda attempt and invokes it in one transaction):
    the attempt's first heartbeat waits for it, then holds the lease (commit) or is refused
    (rollback), never refused while the claim is still committing."""
    task_id = create_task(dispatcher)["task_id"]
    lease = Lease(task_id, 1, str(uuid4()))
    with psycopg.connect(db_url) as conn, ThreadPoolExecutor(1) as pool:
        # The relay's claim for a function (taskplat_claim, migration 0020), left uncommitted.
        claimed = conn.execute(
            "SELECT task_id FROM taskplat_claim(ARRAY[%s::uuid], NULL, NULL, 60, %s, %s::uuid,"
            " 'taskplat-', 5)",
            (task_id, dispatcher.clock.now(), lease.lease_token),
        ).fetchall()
        assert len(claimed) == 1
        answer = pool.submit(heartbeat, dispatcher, lease)
        wait_for(
            lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()[0],  # type: ignore[index]
            timeout=30,
            what="the heartbeat to wait on the claim's row lock",
        )
        conn.commit() if outcome == "commit" else conn.rollback()
        response = answer.result(timeout=30)
    if outcome == "commit":
        assert response.status_code == 200, response.text
    else:
        assert_rejected(response, "StaleLease")
