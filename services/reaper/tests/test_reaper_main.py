"""`python -m taskplat.reaper` as a real process: wiring, bad settings, ops endpoints, SIGTERM."""

from __future__ import annotations

import socket
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
        "taskplat.reaper",
        {"TASKPLAT_REAPER_REAP_BATCH_SIZE": "0", "TASKPLAT_REAPER_RETENTION_SECONDS": "soon"},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("taskplat-reaper: invalid settings:")
    assert "reap_batch_size" in lines[0]
    assert "retention_seconds" in lines[0]


def test_bad_database_url_exits_non_zero_with_one_line() -> None:
    result = run_with_bad_settings("taskplat.reaper", {"DATABASE_URL": "postgresql://a b c"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "taskplat-reaper: invalid settings: DATABASE_URL is not a valid libpq URL"
    ]


def test_runs_against_the_database_clock_serves_ops_and_stops_on_sigterm(
    db_url: str, rows: LoopRows
) -> None:
    now = datetime.now(UTC)
    task_id = rows.insert_task(
        now, "Running", lease_expires_at=now - seconds(1), queue="gpu", operator="train"
    )
    ops_port = free_port()
    service = LoopProcess(
        "taskplat.reaper",
        {
            "DATABASE_URL": db_url,
            "TASKPLAT_LOG_FORMAT": "json",
            "TASKPLAT_REAPER_INTERVAL_SECONDS": "0.1",
            "TASKPLAT_REAPER_OPS_PORT": str(ops_port),
        },
    )
    try:
        wait_for(
            lambda: rows.task(task_id)["status"] == "Failed",
            timeout=30,
            what="the reaper to time out the expired lease",
        )
        [event] = wait_for(
            lambda: [e for e in service.events() if e["event"] == "task_lease_expired"],
            timeout=10,
            what="the task_lease_expired event",
        )
        assert (event["task_id"], event["attempt"], event["worker_id"]) == (
            str(task_id),
            1,
            "worker-1",
        )
        assert (event["queue"], event["operator"], event["service"]) == ("gpu", "train", "reaper")

        assert ops_status(ops_port) == 200
        metrics = ops_get(ops_port, "/metrics")
        assert metrics is not None and metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        lines = metric_lines(metrics.text)
        assert 'taskplat_leases_expired_total{operator="train",queue="gpu"} 1.0' in lines
        assert "taskplat_loop_batch_duration_seconds" in metrics.text
        assert any(
            line.startswith('taskplat_loop_batch_duration_seconds_count{loop="reaper"}')
            for line in lines
        )
        missing = ops_get(ops_port, "/nothing")
        assert missing is not None and missing.status_code == 404
    finally:
        code = service.stop()
    assert code == 0, "\n".join(service.lines)
    assert service.logged("loop_stopped")
    assert rows.task(task_id)["attempt_outcome"] == "LeaseExpired"


def test_an_ops_port_already_in_use_exits_non_zero_with_one_line(db_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_with_bad_settings(
            "taskplat.reaper", {"DATABASE_URL": db_url, "TASKPLAT_REAPER_OPS_PORT": str(port)}
        )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"taskplat-reaper: invalid settings: cannot serve ops on 127.0.0.1:{port}"
    )
