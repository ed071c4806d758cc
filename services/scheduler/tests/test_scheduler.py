"""The scheduler's rules against real Postgres, time moved by a FakeClock."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from uuid import UUID

import psycopg
from psycopg import sql

from taskplat.common.clock import FakeClock
from taskplat.common.db.notify import OUTBOX_CHANNEL
from taskplat.scheduler.scheduler import Scheduler, SchedulerBatch
from taskplat.testkit.loops_rows import (
    LoopRows,
    Q,
    completion_params,
    run_replicas,
    seconds,
)

MakeScheduler = Callable[..., Scheduler]


def assert_one_wakeup(rows: LoopRows, task_id: UUID, clock: FakeClock) -> None:
    outbox = rows.outbox(task_id)
    assert len(outbox) == 1
    row = outbox[0]
    assert row["kind"] == "enqueue_task"
    assert row["payload"] == {"task_id": str(task_id)}
    assert row["queue"] == "default"
    assert row["created_at"] == row["available_at"] == clock.now()
    assert row["sent_at"] is None


def test_due_scheduled_task_is_promoted_not_before(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    scheduler = make_scheduler()
    task_id = rows.insert_task(clock.now(), "Scheduled", scheduled_for=clock.now() + seconds(60))

    assert scheduler.run_once() == SchedulerBatch(0, 0, 0, more=False)
    clock.advance(59.999)
    assert scheduler.run_once().promoted == 0
    assert rows.task(task_id)["status"] == "Scheduled"
    assert rows.outbox(task_id) == []

    clock.advance(0.001)
    assert scheduler.run_once() == SchedulerBatch(1, 0, 0, more=False)
    task = rows.task(task_id)
    assert task["status"] == "Queued"
    assert task["queued_at"] == clock.now()
    assert task["attempt"] == 1
    assert_one_wakeup(rows, task_id, clock)

    assert scheduler.run_once().promoted == 0
    assert len(rows.outbox(task_id)) == 1


def test_scheduled_task_past_its_expiry_is_left_for_the_reaper(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    task_id = rows.insert_task(
        clock.now(),
        "Scheduled",
        scheduled_for=clock.now() + seconds(10),
        expires_at=clock.now() + seconds(5),
    )
    clock.advance(20)
    assert make_scheduler().run_once().promoted == 0
    assert rows.task(task_id)["status"] == "Scheduled"


def test_failed_task_is_retried_at_next_retry_at_as_the_next_attempt(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    scheduler = make_scheduler()
    start = clock.now()
    task_id = rows.insert_task(
        start,
        "Failed",
        attempt=4,
        replay_offset=3,
        max_attempts=3,
        next_retry_at=start + seconds(5),
        attempt_outcome="LeaseExpired",
        last_error="lease expired",
    )
    before = rows.task(task_id)

    clock.advance(4.999)
    assert scheduler.run_once().retried == 0
    assert rows.task(task_id)["status"] == "Failed"
    assert rows.outbox(task_id) == []

    clock.advance(0.001)
    assert scheduler.run_once() == SchedulerBatch(0, 1, 0, more=False)
    task = rows.task(task_id)
    assert task["status"] == "Queued"
    assert task["attempt"] == 5
    assert task["replay_offset"] == 3
    assert task["queued_at"] == clock.now()
    assert task["next_retry_at"] is None
    assert task["attempt_outcome"] is None
    assert task["lease_token"] is None
    assert task["lease_expires_at"] is None
    assert task["worker_id"] is None
    assert task["last_error"] == "lease expired"
    assert task["created_at"] == before["created_at"]
    assert_one_wakeup(rows, task_id, clock)
    # The history keeps the ended attempt; the new one gets its row when claimed.
    assert [a["attempt"] for a in rows.attempts(task_id)] == [4]
    assert len(rows.all_tasks()) == 1

    assert scheduler.run_once().retried == 0
    assert rows.task(task_id)["attempt"] == 5


def test_unclaimed_queued_task_is_republished_once_per_period(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    scheduler = make_scheduler(requeue_after_seconds=60)
    task_id = rows.insert_task(clock.now(), "Queued")
    running = rows.insert_task(clock.now(), "Running", lease_expires_at=clock.now() + seconds(900))
    expired = rows.insert_task(clock.now(), "Queued", expires_at=clock.now() + seconds(30))

    clock.advance(59.999)
    assert scheduler.run_once().republished == 0
    clock.advance(0.001)
    assert scheduler.run_once() == SchedulerBatch(0, 0, 1, more=False)
    assert_one_wakeup(rows, task_id, clock)
    republished = rows.task(task_id)
    assert republished["last_wakeup_at"] == clock.now()
    assert republished["queued_at"] == clock.now() - seconds(60), "queued_at must not move"
    assert republished["status"] == "Queued"

    assert scheduler.run_once().republished == 0
    clock.advance(59)
    assert scheduler.run_once().republished == 0
    clock.advance(1)
    assert scheduler.run_once().republished == 1
    assert len(rows.outbox(task_id)) == 2
    assert rows.outbox(running) == []
    assert rows.outbox(expired) == []


def test_tasks_of_a_paused_queue_are_not_republished_until_it_resumes(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    scheduler = make_scheduler(requeue_after_seconds=60)
    paused = rows.insert_task(clock.now(), "Queued", queue="paused")
    other = rows.insert_task(clock.now(), "Queued")
    rows.set_queue_paused("paused", True)
    clock.advance(600)
    assert scheduler.run_once().republished == 1
    assert rows.outbox(paused) == [] and len(rows.outbox(other)) == 1
    rows.set_queue_paused("paused", False)
    assert scheduler.run_once().republished == 1
    assert len(rows.outbox(paused)) == 1


def test_tasks_of_a_queue_held_for_its_missing_sqs_queue_are_not_republished(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    scheduler = make_scheduler(requeue_after_seconds=60)
    held = rows.insert_task(clock.now(), "Queued", queue="ghost")
    other = rows.insert_task(clock.now(), "Queued")
    rows.set_queue_sqs_missing("ghost", True)
    clock.advance(600)
    assert scheduler.run_once().republished == 1
    assert rows.outbox(held) == [] and len(rows.outbox(other)) == 1
    clock.advance(600)
    assert scheduler.run_once().republished == 1
    assert rows.outbox(held) == []
    rows.set_queue_sqs_missing("ghost", False)
    assert scheduler.run_once().republished == 1
    assert len(rows.outbox(held)) == 1


def test_batches_are_bounded_and_report_more(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    scheduler = make_scheduler(promote_batch_size=2, retry_batch_size=3)
    rows.insert_tasks(5, clock.now(), "Scheduled", scheduled_for=clock.now())
    rows.insert_tasks(3, clock.now(), "Failed", next_retry_at=clock.now())

    assert scheduler.run_once() == SchedulerBatch(2, 3, 0, more=True)
    assert scheduler.run_once() == SchedulerBatch(2, 0, 0, more=True)
    assert scheduler.run_once() == SchedulerBatch(1, 0, 0, more=False)
    assert len(rows.all_outbox()) == 8


def test_the_relay_is_notified_when_the_rows_commit(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock, db_url: str
) -> None:
    rows.insert_task(clock.now(), "Scheduled", scheduled_for=clock.now(), queue="emails")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(OUTBOX_CHANNEL)))
        assert make_scheduler().run_once().promoted == 1
        received = list(listener.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in received] == [(OUTBOX_CHANNEL, "emails")]


def test_two_schedulers_move_each_task_exactly_once(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    failed = rows.insert_tasks(150, clock.now(), "Failed", next_retry_at=clock.now())
    scheduled = rows.insert_tasks(150, clock.now(), "Scheduled", scheduled_for=clock.now())
    replicas = [
        make_scheduler(promote_batch_size=10, retry_batch_size=10, republish_batch_size=10)
        for _ in range(2)
    ]

    results = run_replicas([replica.run_once for replica in replicas])

    batches = [batch for per_replica in results for batch in per_replica]
    assert sum(b.retried for b in batches) == 150
    assert sum(b.promoted for b in batches) == 150
    assert sum(b.republished for b in batches) == 0
    tasks = {task["task_id"]: task for task in rows.all_tasks()}
    assert {tasks[t]["attempt"] for t in failed} == {2}
    assert {tasks[t]["attempt"] for t in scheduled} == {1}
    assert {task["status"] for task in tasks.values()} == {"Queued"}
    outbox = rows.all_outbox()
    assert len(outbox) == 300
    assert sorted(row["task_id"] for row in outbox) == sorted(tasks)
    assert replicas[0].run_once() == SchedulerBatch(0, 0, 0, more=False)


def test_a_late_success_holding_the_row_wins_over_the_retry(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock, db_url: str
) -> None:
    """The timed-out attempt's success lands while its retry is due: the scheduler skips the
    locked row and, once the success committed, never re-queues the Completed task."""
    scheduler = make_scheduler()
    task_id = rows.insert_task(
        clock.now(), "Failed", next_retry_at=clock.now(), attempt_outcome="LeaseExpired"
    )
    task = rows.task(task_id)
    params = completion_params(
        {
            "task_id": task_id,
            "attempt": task["attempt"],
            "lease_token": task["lease_token"],
            "now": clock.now(),
        }
    )
    with psycopg.connect(db_url) as completion, ThreadPoolExecutor(1) as executor:
        # A late success, as the dispatcher makes it (it holds the row lock first).
        completion.execute(Q["lock_task"], params)
        assert completion.execute(Q["complete_late"], params).fetchone()
        assert executor.submit(scheduler.run_once).result(timeout=20).retried == 0
        completion.commit()

    assert scheduler.run_once().retried == 0
    task = rows.task(task_id)
    assert (task["status"], task["attempt"]) == ("Completed", 1)
    assert rows.outbox(task_id) == []


def test_a_busy_queue_gets_its_budget_of_republishes_per_period_and_all_once_idle(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    scheduler = make_scheduler(requeue_after_seconds=60, republish_busy_limit=1)
    backlog = []
    for _ in range(20):  # oldest first: each a millisecond older than the next
        backlog.append(rows.insert_task(clock.now(), "Queued"))
        clock.advance(0.001)
    running = rows.insert_task(clock.now(), "Running", lease_expires_at=clock.now() + seconds(900))
    idle = rows.insert_tasks(3, clock.now(), "Queued", queue="idle")

    clock.advance(61)
    # The busy queue (a Running task) gets its oldest stale task re-announced; the idle one all.
    assert scheduler.run_once().republished == 1 + 3
    assert len(rows.outbox(backlog[0])) == 1
    assert all(len(rows.outbox(task_id)) == 1 for task_id in idle)
    assert scheduler.run_once().republished == 0
    clock.advance(30)
    assert scheduler.run_once().republished == 0, "the busy queue's budget is spent"
    clock.advance(30)
    assert scheduler.run_once().republished == 1 + 3
    assert len(rows.outbox(backlog[1])) == 1, "the next oldest, not the same task again"
    assert len(rows.outbox(backlog[0])) == 1

    # Its workers stop running its tasks: a period after it was last seen busy, every stale
    # task left is re-announced.
    rows.finish_running_task(running, clock.now())
    assert scheduler.run_once().republished == 0, "seen busy within the period"
    clock.advance(60)
    # The 18 never re-announced, the first two again (a period old), and the idle queue's 3.
    assert scheduler.run_once().republished == 18 + 2 + 3
    assert [len(rows.outbox(task_id)) for task_id in backlog] == [2, 2] + [1] * 18
    assert rows.outbox(running) == []


def test_a_second_replica_keeps_its_own_budget_and_no_task_is_republished_twice_a_period(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    first, second = (make_scheduler(requeue_after_seconds=60) for _ in range(2))
    backlog = rows.insert_tasks(5, clock.now(), "Queued")
    rows.insert_task(clock.now(), "Running", lease_expires_at=clock.now() + seconds(900))
    clock.advance(60)
    assert first.run_once().republished == 1
    assert second.run_once().republished == 1
    assert first.run_once().republished == 0 and second.run_once().republished == 0
    assert sorted(len(rows.outbox(task_id)) for task_id in backlog) == [0, 0, 0, 1, 1]
