"""The reaper's expiry of unstarted tasks and its pruning, against real Postgres."""

from __future__ import annotations

from collections.abc import Callable

from taskplat.common.clock import FakeClock
from taskplat.reaper.reaper import Reaper, ReaperBatch
from taskplat.testkit.loops_rows import LoopRows, seconds

MakeReaper = Callable[..., Reaper]
DAY = 24 * 3600.0


def test_queued_and_scheduled_tasks_expire_running_ones_never(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    reaper = make_reaper()
    start = clock.now()
    expires = {"expires_at": start + seconds(5)}
    queued = rows.insert_task(start, "Queued", **expires)
    scheduled = rows.insert_task(start, "Scheduled", scheduled_for=start + seconds(60), **expires)
    running = rows.insert_task(start, "Running", lease_expires_at=start + seconds(600), **expires)
    failed = rows.insert_task(start, "Failed", next_retry_at=start + seconds(600), **expires)
    later = rows.insert_task(start, "Queued", expires_at=start + seconds(50))

    clock.advance(4.999)
    assert reaper.run_once().expired == 0
    clock.advance(0.001)
    assert reaper.run_once() == ReaperBatch(0, 0, 2, 2, 0, 0, more=False)

    for task_id in (queued, scheduled):
        task = rows.task(task_id)
        assert task["status"] == "Dead"
        assert task["dead_reason"] == "Expired"
        assert task["last_error"] == "expired before it started"
        assert task["finished_at"] == clock.now()
        [letter] = rows.outbox(task_id)
        assert letter["kind"] == "dead_letter"
        assert letter["payload"]["dead_reason"] == "Expired"
        assert letter["payload"]["task_id"] == str(task_id)
    assert rows.task(running)["status"] == "Running"
    assert rows.task(failed)["status"] == "Failed"
    assert rows.task(later)["status"] == "Queued"
    assert reaper.run_once() == ReaperBatch(0, 0, 0, 0, 0, 0, more=False)


def test_old_terminal_tasks_and_old_sent_outbox_rows_are_pruned_in_batches(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    reaper = make_reaper(
        prune_batch_size=2,
        outbox_prune_batch_size=1,
        retention_seconds=7 * DAY,
        outbox_retention_seconds=DAY,
    )
    start = clock.now()
    clock.advance(10 * DAY)
    old = start + seconds(2 * DAY)  # finished 8 days ago
    doomed = [
        rows.insert_task(start, status, finished_at=old)
        for status in ("Completed", "Dead", "Canceled")
    ]
    completed = rows.insert_task(start, "Running")  # attempt row, then completed below
    rows.insert_output_and_event(doomed[0], old)
    kept = [
        rows.insert_task(start, "Completed", finished_at=clock.now() - seconds(6 * DAY)),
        rows.insert_task(start, "Queued"),
        rows.insert_task(start, "Failed", next_retry_at=start + seconds(DAY * 20)),
        rows.insert_task(
            start,
            "Running",
            lease_expires_at=clock.now() + seconds(60),
            deadline_at=clock.now() + seconds(60),
        ),
        rows.insert_task(start, "Scheduled", scheduled_for=clock.now() + seconds(DAY)),
    ]
    rows.finish_running_task(completed, old)
    doomed.append(completed)
    sent_old = rows.insert_outbox(kept[0], start, clock.now() - seconds(2 * DAY))
    sent_old_2 = rows.insert_outbox(kept[0], start, clock.now() - seconds(1.5 * DAY))
    sent_recent = rows.insert_outbox(kept[0], start, clock.now() - seconds(0.5 * DAY))
    pending_old = rows.insert_outbox(kept[0], start, None)
    before = rows.counts()

    first = reaper.run_once()
    assert (first.pruned_tasks, first.pruned_outbox, first.more) == (2, 1, True)
    second = reaper.run_once()
    assert (second.pruned_tasks, second.pruned_outbox, second.more) == (2, 1, True)
    third = reaper.run_once()
    assert (third.pruned_tasks, third.pruned_outbox, third.more) == (0, 0, False)

    for task_id in doomed:
        assert rows.task_or_none(task_id) is None
        assert rows.attempts(task_id) == []
    for task_id in kept:
        assert rows.task_or_none(task_id) is not None
    after = rows.counts()
    assert after["tasks"] == before["tasks"] - 4
    assert after["task_outputs"] == before["task_outputs"] - 1 == 0
    assert after["task_events"] == before["task_events"] - 1 == 0
    # attempt rows of the kept Running and Failed tasks remain; the pruned one's went with it
    assert after["task_attempts"] == before["task_attempts"] - 1 == 2
    # (The event's own routing row is pending: the reaper never prunes a pending row.)
    remaining = {row["outbox_id"] for row in rows.all_outbox() if row["kind"] != "route_event"}
    assert remaining == {sent_recent, pending_old}
    assert not remaining & {sent_old, sent_old_2}
