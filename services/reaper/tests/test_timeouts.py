"""The reaper's lease and deadline timeouts against real Postgres, time moved by a FakeClock."""

from __future__ import annotations

import random
from collections.abc import Callable

from taskplat.common.clock import FakeClock
from taskplat.reaper.reaper import Reaper, ReaperBatch
from taskplat.testkit.loops_rows import LoopRows, Q, seconds

MakeReaper = Callable[..., Reaper]

EMPTY = ReaperBatch(0, 0, 0, 0, 0, 0, more=False)


def test_expired_lease_becomes_failed_with_backoff(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    reaper = make_reaper()
    task_id = rows.insert_task(clock.now(), "Running", lease_expires_at=clock.now() + seconds(10))
    before = rows.task(task_id)

    clock.advance(10)
    assert reaper.run_once() == EMPTY
    clock.advance(0.001)
    assert reaper.run_once() == ReaperBatch(1, 0, 0, 0, 0, 0, more=False)

    task = rows.task(task_id)
    assert task["status"] == "Failed"
    assert task["attempt"] == 1
    assert task["attempt_outcome"] == "LeaseExpired"
    assert task["last_error"] == "lease expired"
    # backoff: jitter 0.5 x min(cap 60, base 2 x 2^0) = 1 s
    assert task["next_retry_at"] == clock.now() + seconds(1)
    assert task["lease_token"] == before["lease_token"]
    assert task["lease_expires_at"] is None
    assert task["finished_at"] is None
    assert task["dead_reason"] is None
    [attempt] = rows.attempts(task_id)
    assert attempt["finished_at"] == clock.now()
    assert attempt["outcome"] == "LeaseExpired"
    assert attempt["error"] == "lease expired"
    assert rows.outbox(task_id) == []
    assert reaper.run_once() == EMPTY


def test_backoff_counts_attempts_in_the_current_budget(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    """A lost worker's backoff counts processing attempts; a deadline overrun's counts the
    attempts of the max_attempts budget."""
    second = rows.insert_task(clock.now(), "Running", attempt=2, processing_attempts=1)
    replayed = rows.insert_task(clock.now(), "Running", attempt=5, replay_offset=4)
    capped = rows.insert_task(clock.now(), "Running", attempt=9, processing_attempts=8)
    overrun = {
        "deadline_at": clock.now() - seconds(60),
        "lease_expires_at": clock.now() + seconds(60),
    }
    counted = rows.insert_task(clock.now(), "Running", attempt=3, processing_attempts=1, **overrun)
    clock.advance(11)
    batch = make_reaper().run_once()
    assert (batch.lease_expired, batch.deadline_exceeded) == (3, 1)
    assert rows.task(second)["next_retry_at"] == clock.now() + seconds(0.5 * 4)
    assert rows.task(replayed)["next_retry_at"] == clock.now() + seconds(0.5 * 2)
    assert rows.task(capped)["next_retry_at"] == clock.now() + seconds(0.5 * 60)
    assert rows.task(counted)["next_retry_at"] == clock.now() + seconds(0.5 * 4)
    assert rows.task(replayed)["status"] == "Failed"
    assert rows.task(second)["processing_attempts"] == 2
    assert rows.task(counted)["processing_attempts"] == 1


def test_each_task_of_a_batch_draws_its_own_jitter(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    tasks = rows.insert_tasks(5, clock.now(), "Running")
    clock.advance(11)
    assert make_reaper(rand=random.Random(7)).run_once().lease_expired == 5
    delays = {rows.task(t)["next_retry_at"] - clock.now() for t in tasks}
    assert len(delays) == 5
    assert all(seconds(0) <= delay < seconds(2) for delay in delays)


def test_an_expired_lease_does_not_spend_the_attempt_budget(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    """A lost worker is not the task's fault: the last attempt of max_attempts is retried."""
    task_id = rows.insert_task(clock.now(), "Running", attempt=3, max_attempts=3)
    clock.advance(11)
    assert make_reaper().run_once() == ReaperBatch(1, 0, 0, 0, 0, 0, more=False)
    task = rows.task(task_id)
    assert (task["status"], task["attempt_outcome"], task["dead_reason"]) == (
        "Failed",
        "LeaseExpired",
        None,
    )
    assert task["processing_attempts"] == 1 and task["next_retry_at"] is not None
    assert rows.outbox(task_id) == []


def test_expired_lease_at_the_processing_budget_becomes_dead_with_a_dead_letter(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    task_id = rows.insert_task(
        clock.now(), "Running", attempt=10, processing_attempts=9, queue="emails"
    )
    clock.advance(11)
    assert make_reaper().run_once() == ReaperBatch(1, 0, 0, 1, 0, 0, more=False)

    task = rows.task(task_id)
    assert task["status"] == "Dead"
    assert task["dead_reason"] == "ProcessingAttemptsExceeded"
    assert task["processing_attempts"] == 10
    assert task["attempt_outcome"] == "LeaseExpired"
    assert task["finished_at"] == clock.now()
    assert task["next_retry_at"] is None
    assert rows.attempts(task_id)[0]["outcome"] == "LeaseExpired"
    [letter] = rows.outbox(task_id)
    assert letter["kind"] == "dead_letter"
    assert letter["queue"] == "emails"
    assert letter["created_at"] == letter["available_at"] == clock.now()
    assert letter["payload"]["task_id"] == str(task_id)
    assert letter["payload"]["dead_reason"] == "ProcessingAttemptsExceeded"
    assert letter["payload"]["attempt"] == 10
    assert letter["payload"]["last_error"] == "lease expired"


def test_dead_letter_payload_is_the_dispatchers(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    """The relay reads one payload shape, whoever killed the task."""
    task_id = rows.insert_task(clock.now(), "Running", max_processing_attempts=1)
    clock.advance(11)
    assert make_reaper().run_once().dead_lettered == 1
    rows.conn.execute(
        Q["dead_letter"],
        {"task_id": task_id, "now": clock.now(), "trace_context": None},
    )
    ours, theirs = rows.outbox(task_id)
    assert ours["payload"] == theirs["payload"]


def test_deadline_exceeded_even_while_the_lease_is_fresh(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    reaper = make_reaper(deadline_grace_seconds=30)
    start = clock.now()
    heartbeating = {"lease_expires_at": start + seconds(3600), "deadline_at": start + seconds(100)}
    task_id = rows.insert_task(start, "Running", **heartbeating)
    last = rows.insert_task(start, "Running", attempt=3, **heartbeating)

    clock.advance(130)
    assert reaper.run_once() == EMPTY
    clock.advance(0.001)
    assert reaper.run_once() == ReaperBatch(0, 2, 0, 1, 0, 0, more=False)

    task = rows.task(task_id)
    assert task["status"] == "Failed"
    assert task["attempt_outcome"] == "DeadlineExceeded"
    assert task["last_error"] == "deadline exceeded"
    assert task["next_retry_at"] == clock.now() + seconds(1)
    [attempt] = rows.attempts(task_id)
    assert (attempt["outcome"], attempt["error"]) == ("DeadlineExceeded", "deadline exceeded")
    assert rows.task(last)["status"] == "Dead"
    assert rows.task(last)["dead_reason"] == "AttemptsExhausted"
    assert [row["kind"] for row in rows.outbox(last)] == ["dead_letter"]
    assert rows.outbox(task_id) == []


def test_batches_are_bounded_and_report_more(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    reaper = make_reaper(reap_batch_size=3)
    rows.insert_tasks(4, clock.now(), "Running")
    clock.advance(11)
    assert reaper.run_once() == ReaperBatch(3, 0, 0, 0, 0, 0, more=True)
    assert reaper.run_once() == ReaperBatch(1, 0, 0, 0, 0, 0, more=False)


def test_a_task_that_discards_dies_without_a_dead_letter(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    quiet = {"on_exhausted": "discard"}
    lost = rows.insert_task(clock.now(), "Running", max_processing_attempts=1, **quiet)
    overrun = {"deadline_at": clock.now(), "lease_expires_at": clock.now() + seconds(600)}
    late = rows.insert_task(clock.now(), "Running", max_attempts=1, **overrun, **quiet)
    unstarted = rows.insert_task(clock.now(), "Queued", expires_at=clock.now(), **quiet)
    clock.advance(11)
    batch = make_reaper(deadline_grace_seconds=5).run_once()
    assert (batch.lease_expired, batch.deadline_exceeded, batch.expired) == (1, 1, 1)
    for task_id, reason in (
        (lost, "ProcessingAttemptsExceeded"),
        (late, "AttemptsExhausted"),
        (unstarted, "Expired"),
    ):
        assert (rows.task(task_id)["status"], rows.task(task_id)["dead_reason"]) == ("Dead", reason)
        assert rows.outbox(task_id) == []
