"""The relay holds back wake-ups deep in a backlog that the queue's workers drain by claiming ahead.

Against real Postgres and real SQS. While the queue was claimed ahead within the last
`hold_evidence_seconds` (2 s by default; its `claimed_ahead_at`, which the dispatcher stamps on
a full claim-next), the wake-up of a task with
`hold_depth` Queued tasks of its queue ahead of it stays pending and nothing reaches SQS for it;
it comes due again after twice its age (1 s at least), and is then skipped if its task was claimed
meanwhile, held again if it is still deep, or sent once it is near the front or nobody claims
ahead any more. Without a recent stamp, or with `hold_depth` 0, every wake-up is sent at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row
from relay_harness import Queues, Rows, metric_lines, task_ids_of

from taskplat.common.clock import FakeClock
from taskplat.common.db.queries import parse_queries
from taskplat.common.telemetry import Telemetry
from taskplat.outbox_relay.relay import Relay, RelayBatch

_SQL_PATH = Path(__file__).with_name("relay_hold_rows.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))
QUEUE = "default"
DEPTH = 3


@pytest.fixture
def relay_overrides() -> dict[str, object]:
    return {"hold_depth": DEPTH, "hold_max_seconds": 10.0}


def _run(db_url: str, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        cursor = conn.execute(Q[name], params)
        return cursor.fetchall() if cursor.description else []


def _marks(db_url: str) -> dict[UUID, dict[str, Any]]:
    return {row["task_id"]: row for row in _run(db_url, "hold_marks")}


def _claimed_ahead(db_url: str, at: datetime) -> None:
    _run(db_url, "stamp_claimed_ahead", {"queue": QUEUE, "at": at})


def _backlog(rows: Rows, clock: FakeClock, count: int) -> list[UUID]:
    """`count` Queued tasks, each queued 10 ms after the one before (claim-next's order)."""
    task_ids: list[UUID] = []
    for _ in range(count):
        task_ids += rows.queued_tasks(QUEUE)
        clock.advance(0.01)
    return task_ids


def test_wake_ups_deep_in_a_backlog_claimed_ahead_are_held_then_skipped_or_sent(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, db_url: str
) -> None:
    url = queues.create(QUEUE)
    tasks = _backlog(rows, clock, 6)
    _claimed_ahead(db_url, clock.now())

    assert relay.run_once() == RelayBatch(
        claimed=6, sent=3, dead_letters_sent=0, failed=0, held=3, more=False
    )
    assert sorted(task_ids_of(queues.receive(url, 3))) == sorted(tasks[:3])
    pending = _marks(db_url)
    for task_id in tasks[3:]:
        assert pending[task_id]["sent_at"] is None
        assert pending[task_id]["available_at"] == clock.now() + timedelta(seconds=1)
    assert relay.run_once() == RelayBatch(0, 0, 0, 0, more=False)  # not due yet

    # Still claimed ahead, nothing claimed: still deep, held again for twice the row's age.
    clock.advance(1)
    _claimed_ahead(db_url, clock.now())
    assert relay.run_once() == RelayBatch(
        claimed=3, sent=0, dead_letters_sent=0, failed=0, held=3, more=False
    )
    again = _marks(db_url)[tasks[5]]
    assert again["sent_at"] is None
    assert again["available_at"] == clock.now() + 2 * (clock.now() - again["created_at"])

    # The workers claimed the three oldest and the fourth ahead: the fourth's wake-up is skipped,
    # the last two are near the front now and are sent.
    _run(db_url, "claim_tasks", {"task_ids": tasks[:4]})
    clock.advance(5)
    _claimed_ahead(db_url, clock.now())
    assert relay.run_once() == RelayBatch(
        claimed=3, sent=2, dead_letters_sent=0, failed=0, skipped=1, more=False
    )
    assert sorted(task_ids_of(queues.receive(url, 2))) == sorted(tasks[4:])
    assert _marks(db_url)[tasks[3]]["skipped"] is True


def test_held_wake_ups_are_sent_once_nobody_claims_ahead(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, db_url: str
) -> None:
    url = queues.create(QUEUE)
    tasks = _backlog(rows, clock, 5)
    _claimed_ahead(db_url, clock.now())
    assert relay.run_once().held == 2
    assert len(queues.receive(url, 3)) == 3

    clock.advance(2.5)  # the last full claim-next is older than 2 s
    assert relay.run_once() == RelayBatch(
        claimed=2, sent=2, dead_letters_sent=0, failed=0, more=False
    )
    assert sorted(task_ids_of(queues.receive(url, 2))) == sorted(tasks[3:])


@pytest.mark.parametrize(
    ("relay_overrides", "stamp_age_seconds"),
    [({"hold_depth": DEPTH}, 3.0), ({"hold_depth": 0}, 0.0)],
    ids=["claimed-ahead-3s-ago", "hold-depth-0"],
)
def test_without_a_recent_claim_ahead_or_a_hold_depth_every_wake_up_is_sent(
    relay: Relay,
    rows: Rows,
    queues: Queues,
    clock: FakeClock,
    db_url: str,
    stamp_age_seconds: float,
) -> None:
    url = queues.create(QUEUE)
    tasks = _backlog(rows, clock, 5)
    _claimed_ahead(db_url, clock.now() - timedelta(seconds=stamp_age_seconds))
    assert relay.run_once() == RelayBatch(
        claimed=5, sent=5, dead_letters_sent=0, failed=0, more=False
    )
    assert sorted(task_ids_of(queues.receive(url, 5))) == sorted(tasks)


def test_held_wake_ups_are_counted_and_not_relayed(
    measured_relay: Relay,
    rows: Rows,
    queues: Queues,
    clock: FakeClock,
    telemetry: Telemetry,
    db_url: str,
) -> None:
    queues.create(QUEUE)
    _backlog(rows, clock, 5)
    _claimed_ahead(db_url, clock.now())
    assert measured_relay.run_once().held == 2
    lines = metric_lines(telemetry)
    assert {
        'taskplat_outbox_held_total{kind="enqueue_task"} 2.0',
        'taskplat_outbox_relayed_total{kind="enqueue_task"} 3.0',
    } <= lines


@pytest.mark.parametrize(
    "relay_overrides", [{"hold_depth": DEPTH, "hold_evidence_seconds": 60.0}], ids=["evidence-60s"]
)
def test_how_long_a_claim_ahead_counts_is_a_setting(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, db_url: str
) -> None:
    url = queues.create(QUEUE)
    tasks = _backlog(rows, clock, 5)
    _claimed_ahead(db_url, clock.now() - timedelta(seconds=30))
    batch = relay.run_once()
    assert (batch.claimed, batch.sent, batch.held) == (5, 3, 2)
    assert sorted(task_ids_of(queues.receive(url, 3))) == sorted(tasks[:3])


def test_wake_ups_of_a_queue_whose_workers_wait_on_the_dispatcher_are_held_until_they_stop(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, db_url: str
) -> None:
    """Whatever their depth: a waiting claim takes the oldest Queued task without a wake-up."""
    url = queues.create(QUEUE)
    tasks = _backlog(rows, clock, 2)  # not deep at all
    _run(db_url, "stamp_polled", {"queue": QUEUE, "until": clock.now() + timedelta(seconds=10)})
    assert relay.run_once() == RelayBatch(
        claimed=2, sent=0, dead_letters_sent=0, failed=0, held=2, more=False
    )
    _run(db_url, "claim_tasks", {"task_ids": tasks[:1]})  # a waiting claim took the first
    clock.advance(1)
    assert relay.run_once() == RelayBatch(
        claimed=2, sent=0, dead_letters_sent=0, failed=0, skipped=1, held=1, more=False
    )
    clock.advance(10)  # no waiting claim for longer than the stamp: the wake-up goes out
    assert relay.run_once() == RelayBatch(
        claimed=1, sent=1, dead_letters_sent=0, failed=0, more=False
    )
    assert task_ids_of(queues.receive(url, 1)) == tasks[1:]
