"""`python -m taskplat.reaper` as a real process: wiring, bad settings, SIGTERM."""

from __future__ import annotations

from datetime import UTC, datetime

from loops_rows import LoopProcess, LoopRows, run_with_bad_settings, seconds

from taskplat.devstack.waiting import wait_for


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


def test_runs_against_the_database_clock_and_stops_on_sigterm(db_url: str, rows: LoopRows) -> None:
    now = datetime.now(UTC)
    task_id = rows.insert_task(now, "Running", lease_expires_at=now - seconds(1))
    service = LoopProcess(
        "taskplat.reaper",
        {
            "DATABASE_URL": db_url,
            "TASKPLAT_LOG_FORMAT": "json",
            "TASKPLAT_REAPER_INTERVAL_SECONDS": "0.1",
        },
    )
    try:
        wait_for(
            lambda: rows.task(task_id)["status"] == "Failed",
            timeout=30,
            what="the reaper to time out the expired lease",
        )
        wait_for(lambda: service.logged("task_lease_expired"), timeout=10, what="a log line")
    finally:
        code = service.stop()
    assert code == 0, "\n".join(service.lines)
    assert service.logged("loop_stopped")
    assert rows.task(task_id)["attempt_outcome"] == "LeaseExpired"
