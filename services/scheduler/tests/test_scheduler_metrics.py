"""What the scheduler reports: counters per queue and operator, one log event per moved task."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from structlog.testing import capture_logs

from taskplat.common.clock import FakeClock
from taskplat.common.telemetry import Telemetry
from taskplat.scheduler.scheduler import Scheduler, SchedulerBatch
from taskplat.testkit.loops_rows import LoopRows, metric_lines, seconds

MakeScheduler = Callable[..., Scheduler]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    telemetry = Telemetry("scheduler")
    yield telemetry
    telemetry.shutdown()


def test_a_batch_counts_each_transition_by_queue_and_operator(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock, telemetry: Telemetry
) -> None:
    now = clock.now()
    rows.insert_tasks(2, now, "Scheduled", queue="a", operator="x", scheduled_for=now)
    rows.insert_task(now, "Scheduled", queue="b", operator="y", scheduled_for=now)
    rows.insert_task(now, "Failed", queue="a", operator="x", next_retry_at=now)
    rows.insert_tasks(2, now - seconds(120), "Queued", queue="c", operator="z")
    rows.insert_task(now, "Scheduled", queue="a", operator="x", scheduled_for=now + seconds(9))
    scheduler = make_scheduler(telemetry=telemetry, requeue_after_seconds=60)

    assert scheduler.run_once() == SchedulerBatch(3, 1, 2, more=False)

    lines = metric_lines(telemetry.prometheus_text())
    assert {
        'taskplat_tasks_promoted_total{operator="x",queue="a"} 2.0',
        'taskplat_tasks_promoted_total{operator="y",queue="b"} 1.0',
        'taskplat_tasks_retried_total{operator="x",queue="a"} 1.0',
        'taskplat_tasks_republished_total{queue="c"} 2.0',
    } <= lines
    assert not any(
        line.startswith("taskplat_tasks_retried_total{") and 'queue="b"' in line for line in lines
    )

    # Counters accumulate over batches; an empty batch adds nothing.
    clock.advance(10)
    assert scheduler.run_once() == SchedulerBatch(1, 0, 0, more=False)
    assert scheduler.run_once() == SchedulerBatch(0, 0, 0, more=False)
    assert 'taskplat_tasks_promoted_total{operator="x",queue="a"} 3.0' in metric_lines(
        telemetry.prometheus_text()
    )


def test_each_moved_task_is_one_log_event_with_its_identity(
    make_scheduler: MakeScheduler, rows: LoopRows, clock: FakeClock
) -> None:
    now = clock.now()
    promoted = rows.insert_task(now, "Scheduled", queue="a", operator="x", scheduled_for=now)
    retried = rows.insert_task(now, "Failed", queue="b", operator="y", attempt=2, next_retry_at=now)
    republished = rows.insert_task(now - seconds(120), "Queued", queue="c", operator="z")

    with capture_logs() as logs:
        assert make_scheduler(requeue_after_seconds=60).run_once() == SchedulerBatch(
            1, 1, 1, more=False
        )

    events = [
        {key: entry[key] for key in ("event", "task_id", "attempt", "queue", "operator")}
        for entry in logs
        if entry["event"].startswith("task_")
    ]
    assert events == [
        {"event": "task_promoted", "task_id": str(promoted), "attempt": 1, "queue": "a",
         "operator": "x"},
        {"event": "task_retried", "task_id": str(retried), "attempt": 3, "queue": "b",
         "operator": "y"},
        {"event": "task_republished", "task_id": str(republished), "attempt": 1, "queue": "c",
         "operator": "z"},
    ]  # fmt: skip
