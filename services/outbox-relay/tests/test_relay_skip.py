"""The relay skips wake-ups of tasks that are no longer Queued, and counts its SQS requests.

Against real Postgres and real SQS: a wake-up whose task was claimed, canceled or pruned before the
relay got to it is marked sent (`skipped`) and nothing reaches SQS; a task still Queued always gets
its message, a dead letter is always sent, and a task queued again after a skip is woken by its new
row. With the setting off every row is sent as before.
"""

from __future__ import annotations

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

_SQL_PATH = Path(__file__).with_name("relay_skip_rows.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))


def _run(db_url: str, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        cursor = conn.execute(Q[name], params)
        return cursor.fetchall() if cursor.description else []


def _marks(db_url: str) -> dict[UUID, list[dict[str, Any]]]:
    marks: dict[UUID, list[dict[str, Any]]] = {}
    for row in _run(db_url, "skip_marks"):
        marks.setdefault(row["task_id"], []).append(row)
    return marks


def test_wakeups_of_tasks_no_longer_queued_are_marked_sent_without_a_message(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, db_url: str
) -> None:
    url = queues.create("default")
    claimed = rows.queued_tasks("default", 3)
    canceled = rows.queued_tasks("default", 2)
    pruned = rows.queued_tasks("default", 1)
    queued = rows.queued_tasks("default", 2)
    _run(db_url, "claim_tasks", {"task_ids": claimed})
    _run(db_url, "cancel_tasks", {"task_ids": canceled})
    _run(db_url, "delete_tasks", {"task_ids": pruned})

    assert relay.run_once() == RelayBatch(
        claimed=8, sent=2, dead_letters_sent=0, failed=0, skipped=6, more=False
    )

    assert sorted(task_ids_of(queues.receive(url, 2))) == sorted(queued)
    marks = _marks(db_url)
    for task_id in (*claimed, *canceled, *pruned):
        [mark] = marks[task_id]
        assert (mark["sent_at"], mark["skipped"], mark["send_attempts"]) == (clock.now(), True, 0)
    for task_id in queued:
        [mark] = marks[task_id]
        assert (mark["sent_at"], mark["skipped"], mark["send_attempts"]) == (clock.now(), False, 1)
    assert relay.run_once() == RelayBatch(0, 0, 0, 0, more=False)


def test_a_dead_letter_is_always_sent_whatever_its_task_state(
    relay: Relay, rows: Rows, queues: Queues, db_url: str
) -> None:
    dlq_url = queues.create_dead_letters()
    dead = rows.dead_task("default")

    assert relay.run_once() == RelayBatch(
        claimed=1, sent=0, dead_letters_sent=1, failed=0, more=False
    )

    assert len(queues.receive(dlq_url, 1)) == 1
    assert [mark["skipped"] for mark in _marks(db_url)[dead]] == [False]


def test_a_task_queued_again_after_a_skip_is_woken_by_its_new_row(
    relay: Relay, rows: Rows, queues: Queues, clock: FakeClock, db_url: str
) -> None:
    url = queues.create("default")
    [task_id] = rows.queued_tasks("default")
    _run(db_url, "claim_tasks_at", {"task_ids": [task_id], "now": clock.now()})
    assert relay.run_once().skipped == 1

    # The attempt's lease ran out (the reaper), and its retry came due (the scheduler queued
    # the next attempt, writing a new wake-up).
    clock.advance(60)
    assert _run(db_url, "reap_timeouts", {"now": clock.now()}) == [
        {"task_id": task_id, "status": "Failed"}
    ]
    clock.advance(120)
    assert _run(db_url, "queue_due", {"now": clock.now()}) == [
        {"task_id": task_id, "moved_from": "Failed"}
    ]
    assert relay.run_once() == RelayBatch(
        claimed=1, sent=1, dead_letters_sent=0, failed=0, more=False
    )

    assert task_ids_of(queues.receive(url, 1)) == [task_id]
    assert [mark["skipped"] for mark in _marks(db_url)[task_id]] == [True, False]


@pytest.mark.parametrize("relay_overrides", [{"skip_not_queued": False}])
def test_with_skipping_off_every_wakeup_is_sent(
    relay: Relay, rows: Rows, queues: Queues, db_url: str
) -> None:
    url = queues.create("default")
    claimed = rows.queued_tasks("default", 2)
    _run(db_url, "claim_tasks", {"task_ids": claimed})

    assert relay.run_once() == RelayBatch(
        claimed=2, sent=2, dead_letters_sent=0, failed=0, more=False
    )

    assert sorted(task_ids_of(queues.receive(url, 2))) == sorted(claimed)
    assert not any(mark["skipped"] for marks in _marks(db_url).values() for mark in marks)


def test_skips_and_sqs_requests_are_counted(
    measured_relay: Relay, rows: Rows, queues: Queues, telemetry: Telemetry, db_url: str
) -> None:
    urls = {queue: queues.create(queue) for queue in ("alpha", "beta")}
    alpha = rows.queued_tasks("alpha", 23)  # 3 SendMessageBatch calls: 10 + 10 + 3
    beta = rows.queued_tasks("beta", 12)  # 2 calls, of which 4 rows are skipped: 8 sent, 1 call
    _run(db_url, "claim_tasks", {"task_ids": beta[:4]})

    assert measured_relay.run_once() == RelayBatch(
        claimed=35, sent=31, dead_letters_sent=0, failed=0, skipped=4, more=False
    )

    assert sorted(task_ids_of(queues.receive(urls["alpha"], 23))) == sorted(alpha)
    assert sorted(task_ids_of(queues.receive(urls["beta"], 8))) == sorted(beta[4:])
    lines = metric_lines(telemetry)
    assert {
        'taskplat_sqs_requests_total{op="send_message_batch"} 4.0',
        'taskplat_outbox_skipped_total{kind="enqueue_task"} 4.0',
        'taskplat_outbox_relayed_total{kind="enqueue_task"} 35.0',
        'taskplat_sqs_sent_total{kind="enqueue_task",queue="alpha"} 23.0',
        'taskplat_sqs_sent_total{kind="enqueue_task",queue="beta"} 8.0',
    } <= lines
    # Queue URLs are looked up once per queue (more when parallel calls miss the cache at once).
    assert any(line.startswith('taskplat_sqs_requests_total{op="get_queue_url"}') for line in lines)

    # A batch of only skipped rows makes no SQS request at all.
    skipped_only = rows.queued_tasks("alpha", 5)
    _run(db_url, "cancel_tasks", {"task_ids": skipped_only})
    assert measured_relay.run_once().skipped == 5
    lines = metric_lines(telemetry)
    assert 'taskplat_sqs_requests_total{op="send_message_batch"} 4.0' in lines
    assert 'taskplat_outbox_skipped_total{kind="enqueue_task"} 9.0' in lines
