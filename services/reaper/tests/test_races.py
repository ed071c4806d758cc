"""The reaper against concurrent completions, heartbeats and other reaper replicas."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import DictRow, dict_row

from taskplat.common.clock import FakeClock
from taskplat.reaper.reaper import Reaper, ReaperBatch
from taskplat.testkit.loops_rows import LoopRows, Q, completion_params, run_replicas

MakeReaper = Callable[..., Reaper]


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


@contextmanager
def open_transaction(db_url: str) -> Iterator[psycopg.Connection[DictRow]]:
    """A connection inside a transaction the test commits (or rolls back) itself."""
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        yield conn


def fence(rows: LoopRows, task_id: UUID, clock: FakeClock) -> dict[str, Any]:
    """The parameters of the dispatcher's completion (and heartbeat) of the task's attempt."""
    task = rows.task(task_id)
    return completion_params(
        {
            "task_id": task_id,
            "attempt": task["attempt"],
            "lease_token": task["lease_token"],
            "now": clock.now(),
        }
    )


def test_a_completion_holding_the_row_wins_over_the_reaper(
    make_reaper: MakeReaper,
    rows: LoopRows,
    clock: FakeClock,
    db_url: str,
    executor: ThreadPoolExecutor,
) -> None:
    reaper = make_reaper()
    task_id = rows.insert_task(clock.now(), "Running", attempt=3, max_attempts=3)
    clock.advance(11)  # the lease ran out, but the worker's completion is on its way
    params = fence(rows, task_id, clock)

    with open_transaction(db_url) as completion:
        assert completion.execute(Q["complete_running"], params).fetchone()
        # the row lock is held: the reaper, in another thread, skips the row without waiting
        batch = executor.submit(reaper.run_once).result(timeout=20)
        assert batch.lease_expired == 0
        completion.commit()

    assert reaper.run_once().lease_expired == 0
    task = rows.task(task_id)
    assert task["status"] == "Completed"
    assert task["attempt_outcome"] == "Completed"
    assert task["dead_reason"] is None
    assert rows.attempts(task_id)[0]["outcome"] == "Completed"
    assert rows.outbox(task_id) == []


def test_a_heartbeat_holding_the_row_keeps_the_task_running(
    make_reaper: MakeReaper,
    rows: LoopRows,
    clock: FakeClock,
    db_url: str,
    executor: ThreadPoolExecutor,
) -> None:
    reaper = make_reaper()
    task_id = rows.insert_task(clock.now(), "Running")
    clock.advance(11)
    params = {**fence(rows, task_id, clock), "lease_seconds": 10.0}

    with open_transaction(db_url) as heartbeat:
        assert heartbeat.execute(Q["heartbeat"], params).fetchone()
        assert executor.submit(reaper.run_once).result(timeout=20).lease_expired == 0
        heartbeat.commit()

    assert reaper.run_once().lease_expired == 0
    assert rows.task(task_id)["status"] == "Running"
    assert rows.attempts(task_id)[0]["outcome"] is None


def test_a_completion_after_the_reap_finds_a_timed_out_attempt(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    """Reaper first: the completion's Running guard no longer matches; the row keeps what the
    dispatcher needs to accept it as a late reply of the same attempt."""
    reaper = make_reaper()
    task_id = rows.insert_task(clock.now(), "Running")
    token = rows.task(task_id)["lease_token"]
    clock.advance(11)
    params = fence(rows, task_id, clock)

    assert reaper.run_once().lease_expired == 1
    assert rows.conn.execute(Q["complete_running"], params).fetchone() is None

    task = rows.task(task_id)
    assert task["status"] == "Failed"
    assert task["attempt_outcome"] == "LeaseExpired"
    assert task["attempt"] == 1
    assert task["lease_token"] == token


def test_two_reapers_time_out_each_attempt_exactly_once(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    # An expired lease spends a processing attempt, not one of max_attempts.
    last_chance = set(
        rows.insert_tasks(150, clock.now(), "Running", max_attempts=1, max_processing_attempts=1)
    )
    retryable = set(rows.insert_tasks(150, clock.now(), "Running", max_attempts=3))
    clock.advance(11)
    replicas = [make_reaper(reap_batch_size=10) for _ in range(2)]

    results = run_replicas([replica.run_once for replica in replicas])

    batches: list[ReaperBatch] = [b for per_replica in results for b in per_replica]
    assert sum(b.lease_expired for b in batches) == 300
    assert sum(b.dead_lettered for b in batches) == 150
    tasks = {task["task_id"]: task for task in rows.all_tasks()}
    assert {tasks[t]["status"] for t in last_chance} == {"Dead"}
    assert {tasks[t]["status"] for t in retryable} == {"Failed"}
    assert {task["attempt"] for task in tasks.values()} == {1}
    assert {task["attempt_outcome"] for task in tasks.values()} == {"LeaseExpired"}
    outbox = rows.all_outbox()
    assert sorted(row["task_id"] for row in outbox) == sorted(last_chance)
    assert {row["kind"] for row in outbox} == {"dead_letter"}
    assert rows.attempts_closed_with("LeaseExpired", clock.now()) == 300
    assert replicas[1].run_once() == ReaperBatch(0, 0, 0, 0, 0, 0, more=False)
