"""What the reaper reports: counters per queue, operator and reason, one log event per
transition."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from structlog.testing import capture_logs

from taskplat.common.clock import FakeClock
from taskplat.common.telemetry import Telemetry
from taskplat.reaper.reaper import Reaper, ReaperBatch
from taskplat.testkit.loops_rows import LoopRows, metric_lines, seconds

MakeReaper = Callable[..., Reaper]
DAY = 24 * 3600.0


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    telemetry = Telemetry("reaper")
    yield telemetry
    telemetry.shutdown()


def test_a_batch_counts_timeouts_deaths_expiries_and_pruning(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock, telemetry: Telemetry
) -> None:
    start = clock.now()
    ax = {"queue": "a", "operator": "x"}
    by = {"queue": "b", "operator": "y", "lease_expires_at": start + seconds(600)}
    rows.insert_tasks(2, start, "Running", **ax)
    rows.insert_task(
        start, "Running", attempt=3, processing_attempts=2, max_processing_attempts=3, **ax
    )
    rows.insert_task(start, "Running", deadline_at=start - seconds(60), **by)
    rows.insert_task(start, "Running", attempt=2, max_attempts=2, deadline_at=start, **by)
    queued = rows.insert_task(start, "Queued", queue="c", operator="z", expires_at=start)
    rows.insert_task(start - seconds(8 * DAY), "Completed")
    for _ in range(2):
        rows.insert_outbox(queued, start - seconds(2 * DAY), sent_at=start - seconds(2 * DAY))
    reaper = make_reaper(telemetry=telemetry, deadline_grace_seconds=5)

    clock.advance(11)
    assert reaper.run_once() == ReaperBatch(3, 2, 1, 3, 1, 2, more=False)

    lines = metric_lines(telemetry.prometheus_text())
    assert {
        'taskplat_leases_expired_total{operator="x",queue="a"} 3.0',
        'taskplat_tasks_failed_total{operator="x",queue="a",reason="LeaseExpired"} 3.0',
        'taskplat_tasks_dead_total{operator="x",queue="a",reason="ProcessingAttemptsExceeded"} 1.0',
        'taskplat_deadlines_exceeded_total{operator="y",queue="b"} 2.0',
        'taskplat_tasks_failed_total{operator="y",queue="b",reason="DeadlineExceeded"} 2.0',
        'taskplat_tasks_dead_total{operator="y",queue="b",reason="AttemptsExhausted"} 1.0',
        'taskplat_tasks_expired_total{operator="z",queue="c"} 1.0',
        'taskplat_tasks_dead_total{operator="z",queue="c",reason="Expired"} 1.0',
        "taskplat_tasks_pruned_total 1.0",
        "taskplat_outbox_pruned_total 2.0",
    } <= lines
    counted = {line for line in lines if line.startswith(("taskplat_tasks_", "taskplat_lea"))}
    assert len(counted) == 8, counted  # nothing else was counted (and no task_id label)

    assert reaper.run_once() == ReaperBatch(0, 0, 0, 0, 0, 0, more=False)
    assert metric_lines(telemetry.prometheus_text()) >= lines  # an empty batch adds nothing


def test_each_transition_is_logged_with_the_task_identity(
    make_reaper: MakeReaper, rows: LoopRows, clock: FakeClock
) -> None:
    start = clock.now()
    retried = rows.insert_task(start, "Running", queue="a", operator="x", worker_id="w-1")
    dead = rows.insert_task(
        start, "Running", queue="a", operator="x", worker_id="w-2", max_processing_attempts=1
    )
    expired = rows.insert_task(start, "Scheduled", queue="c", operator="z", expires_at=start)
    clock.advance(11)

    with capture_logs() as logs:
        assert make_reaper().run_once() == ReaperBatch(2, 0, 1, 2, 0, 0, more=False)

    fields = ("task_id", "attempt", "queue", "operator", "worker_id", "status", "reason")
    events = sorted(
        (entry["event"], tuple(entry.get(field) for field in fields))
        for entry in logs
        if entry["event"].startswith("task_")
    )
    assert events == sorted([
        ("task_lease_expired", (str(retried), 1, "a", "x", "w-1", "Failed", "LeaseExpired")),
        ("task_dead", (str(dead), 1, "a", "x", "w-2", "Dead", "ProcessingAttemptsExceeded")),
        ("task_expired", (str(expired), 1, "c", "z", None, "Dead", "Expired")),
    ])  # fmt: skip
    by_event = {entry["event"]: entry for entry in logs}
    assert by_event["task_dead"]["cause"] == "LeaseExpired"
    assert by_event["task_expired"]["expired_from"] == "Scheduled"
    assert by_event["task_lease_expired"]["next_retry_at"] == (clock.now() + seconds(1)).isoformat()
    assert "worker_id" not in by_event["task_expired"]
