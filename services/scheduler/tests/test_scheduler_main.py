"""`python -m taskplat.scheduler` as a real process: wiring, bad settings, SIGTERM."""

from __future__ import annotations

from datetime import UTC, datetime

from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.loops_rows import (
    LoopProcess,
    LoopRows,
    metric_lines,
    ops_get,
    ops_status,
    run_with_bad_settings,
    seconds,
)


def test_bad_settings_exit_non_zero_with_one_line() -> None:
    result = run_with_bad_settings(
        "taskplat.scheduler", {"TASKPLAT_SCHEDULER_INTERVAL_SECONDS": "-1"}
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("taskplat-scheduler: invalid settings:")
    assert "interval_seconds" in lines[0]


def test_runs_against_the_database_clock_serves_ops_and_stops_on_sigterm(
    db_url: str, rows: LoopRows
) -> None:
    now = datetime.now(UTC)
    task_id = rows.insert_task(
        now, "Scheduled", scheduled_for=now - seconds(1), queue="mail", operator="send"
    )
    ops_port = free_port()
    service = LoopProcess(
        "taskplat.scheduler",
        {
            "DATABASE_URL": db_url,
            "TASKPLAT_LOG_FORMAT": "json",
            "TASKPLAT_SCHEDULER_INTERVAL_SECONDS": "0.1",
            "TASKPLAT_SCHEDULER_OPS_PORT": str(ops_port),
        },
    )
    try:
        wait_for(
            lambda: rows.task(task_id)["status"] == "Queued",
            timeout=30,
            what="the scheduler to promote the due task",
        )
        wait_for(lambda: service.logged("loop_batch"), timeout=10, what="a batch log line")
        [promoted] = wait_for(
            lambda: [e for e in service.events() if e["event"] == "task_promoted"],
            timeout=10,
            what="the task_promoted event",
        )
        assert promoted["task_id"] == str(task_id)
        assert (promoted["attempt"], promoted["queue"], promoted["operator"]) == (1, "mail", "send")
        assert promoted["service"] == "scheduler"

        assert ops_status(ops_port) == 200
        metrics = ops_get(ops_port, "/metrics")
        assert metrics is not None and metrics.status_code == 200
        lines = metric_lines(metrics.text)
        assert 'taskplat_tasks_promoted_total{operator="send",queue="mail"} 1.0' in lines
        assert any(
            line.startswith('taskplat_loop_batch_duration_seconds_count{loop="scheduler"}')
            for line in lines
        )
    finally:
        code = service.stop()
    assert code == 0, "\n".join(service.lines)
    assert service.logged("loop_stopped")
    assert len(rows.outbox(task_id)) == 1
