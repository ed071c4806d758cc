"""`python -m taskplat.outbox_relay` as a real process: bad settings, no database, a clean run
with its ops endpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from relay_harness import Queues, Rows, task_ids_of

from taskplat.common.clock import SystemClock
from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.outbox_relay.settings import RelaySettings


def _env(**values: str) -> dict[str, str]:
    """A clean environment: nothing from the developer's shell but PATH and HOME."""
    env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    env.update(values)
    return env


@contextmanager
def _relay_process(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "taskplat.outbox_relay"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def _relayed(metrics: str) -> str | None:
    return metrics if "taskplat_outbox_relayed_total{" in metrics else None


def test_invalid_settings_exit_non_zero_with_a_one_line_message() -> None:
    with _relay_process(_env(TASKPLAT_RELAY_BATCH_SIZE="0")) as process:
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert stdout == ""
    assert stderr.strip().splitlines() == [
        "taskplat-outbox-relay: invalid settings: batch_size: "
        "Input should be greater than or equal to 1"
    ]


def test_an_unreachable_database_exits_non_zero_with_a_clear_message() -> None:
    env = _env(
        DATABASE_URL=f"postgresql://nobody@127.0.0.1:{free_port()}/nothing",
        TASKPLAT_DB_CONNECT_TIMEOUT_SECONDS="1",
        TASKPLAT_LOG_LEVEL="CRITICAL",
    )
    with _relay_process(env) as process:
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert (
        stderr.strip().splitlines()[-1] == "taskplat-outbox-relay: cannot connect to the database"
    )


def test_the_process_relays_rows_and_stops_cleanly_on_sigterm(
    settings: RelaySettings, rows: Rows, queues: Queues
) -> None:
    url = queues.create("default")
    env = _env(
        DATABASE_URL=settings.database_url.get_secret_value(),
        SQS_ENDPOINT_URL=settings.sqs_endpoint_url or "",
        TASKPLAT_SQS_QUEUE_PREFIX=settings.sqs_queue_prefix,
        TASKPLAT_DEAD_LETTER_QUEUE=settings.dead_letter_queue_name,
        TASKPLAT_RELAY_INTERVAL_SECONDS="0.2",
        TASKPLAT_RELAY_OPS_PORT=str(ops_port := free_port()),
    )
    with _relay_process(env) as process:
        # The process runs on the database clock, so the rows are written at the database's now.
        rows = Rows(rows.db_url, SystemClock())
        task_ids = rows.queued_tasks("default", 2)
        assert sorted(task_ids_of(queues.receive(url, 2, timeout=30))) == sorted(task_ids)
        wait_for(
            lambda: all(row["sent_at"] is not None for row in rows.outbox()),
            timeout=10,
            what="the rows to be marked sent",
        )
        ops = f"http://127.0.0.1:{ops_port}"
        assert httpx.get(f"{ops}/healthz", timeout=5).status_code == 200
        metrics = wait_for(
            lambda: _relayed(httpx.get(f"{ops}/metrics", timeout=5).text),
            timeout=10,
            what="the relayed rows in /metrics",
        )
        assert 'taskplat_outbox_relayed_total{kind="enqueue_task"} 2.0' in metrics
        assert 'taskplat_sqs_sent_total{kind="enqueue_task",queue="default"} 2.0' in metrics
        assert 'taskplat_loop_batch_duration_seconds_count{loop="outbox_relay"}' in metrics
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0
    assert '"event": "loop_stopped"' in stderr
