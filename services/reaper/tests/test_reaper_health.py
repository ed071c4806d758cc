"""The reaper's `/healthz` follows its progress: 503 while Postgres is down, 200 once it is back.

Runs the real process against a Postgres server of the test's own (never the session's shared one,
which it stops and starts again on the same port).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from taskplat.common.db.migrate import apply_migrations
from taskplat.devstack.ports import free_port
from taskplat.devstack.postgres import PrivatePostgres
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.loops_rows import LoopProcess, metric_lines, ops_get, ops_status


def batches_done(ops_port: int) -> float:
    """Completed batches of the reaper's loop, from its /metrics (0 while it does not answer)."""
    response = ops_get(ops_port, "/metrics")
    if response is None:
        return 0.0
    prefix = 'taskplat_loop_batch_duration_seconds_count{loop="reaper"} '
    counts = [
        float(line[len(prefix) :])
        for line in metric_lines(response.text)
        if line.startswith(prefix)
    ]
    return counts[0] if counts else 0.0


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[PrivatePostgres]:
    server = PrivatePostgres(tmp_path / "pg", port=free_port(), die_with_parent=True)
    server.start()
    try:
        apply_migrations(server.url)
        yield server
    finally:
        server.stop(remove_data=True)


def test_healthz_turns_unhealthy_while_postgres_is_down_and_healthy_once_it_returns(
    private_postgres: PrivatePostgres,
) -> None:
    ops_port = free_port()
    service = LoopProcess(
        "taskplat.reaper",
        {
            "DATABASE_URL": private_postgres.url,
            "TASKPLAT_LOG_FORMAT": "json",
            "TASKPLAT_DB_CONNECT_TIMEOUT_SECONDS": "1",
            "TASKPLAT_REAPER_INTERVAL_SECONDS": "0.2",
            "TASKPLAT_REAPER_STALL_SECONDS": "2",
            "TASKPLAT_REAPER_OPS_PORT": str(ops_port),
        },
    )
    try:
        wait_for(lambda: batches_done(ops_port) > 0, timeout=30, what="the reaper's first batches")
        assert ops_status(ops_port) == 200

        private_postgres.stop()
        wait_for(lambda: ops_status(ops_port) == 503, timeout=30, what="/healthz to turn 503")
        unhealthy = ops_get(ops_port, "/healthz")
        assert unhealthy is not None
        assert unhealthy.json()["status"] == "unhealthy"
        assert "no batch completed" in unhealthy.json()["reason"]
        assert service.proc.poll() is None, "the reaper must survive a lost database"

        private_postgres.start()
        wait_for(lambda: ops_status(ops_port) == 200, timeout=90, what="/healthz to be 200 again")
        progressed = batches_done(ops_port)
        wait_for(lambda: batches_done(ops_port) > progressed, timeout=10, what="batches after it")
        errors = ops_get(ops_port, "/metrics")
        assert errors is not None
        assert 'taskplat_loop_errors_total{loop="reaper"}' in errors.text
    finally:
        code = service.stop()
    assert code == 0, "\n".join(service.lines[-20:])
