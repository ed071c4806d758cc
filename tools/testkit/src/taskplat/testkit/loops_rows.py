"""Test rows for the scheduler's and the reaper's tests (not product code).

Shared by both packages' tests from the testkit (`taskplat.testkit.loops_rows`). What
another service does to a task (a completion, a heartbeat, a late success, a dead-letter record)
is done through the SQL functions every service calls (`Q`), never a copy of its statements. A
`LoopRows` holds one autocommit connection of its own: each call commits at once, so what it writes
is what the loops under test see. Inserted tasks get the column values a real dispatcher would have
written for their status (a Running task has a lease, a deadline and an open attempt row).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import psycopg
from psycopg import Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from taskplat.common.db.pools import make_pool
from taskplat.common.db.queries import parse_queries
from taskplat.common.settings import DatabaseSettings

_SQL_PATH = Path(__file__).with_name("loops_rows.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))


def completion_params(fence: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The parameters of a holder's completion (`Q["complete_running"]`) or late success
    (`Q["complete_late"]`), through the platform's functions, for a plain Completed report of
    `fence` (`task_id`, `attempt`, `lease_token`, `now`)."""
    return {
        "status": "Completed",
        "ended": "Completed",
        "retryable": True,
        "result": None,
        "error_message": None,
        "attempt_error": None,
        "retry_after_seconds": None,
        "jitter": 0.5,
        "completion_digest": "digest",
        "trace_context": None,
        "events": json.dumps([]),
        "outputs": json.dumps([]),
        **fence,
        **fields,
    }


Row = dict[str, Any]
Pool = ConnectionPool[Connection[DictRow]]


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


@contextmanager
def open_pool(settings: DatabaseSettings, name: str = "loops-test") -> Iterator[Pool]:
    pool = make_pool(settings, application_name=name)
    pool.open(wait=True, timeout=30)
    try:
        yield pool
    finally:
        pool.close()


class LoopRows:
    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.conn: Connection[DictRow] = psycopg.connect(
            db_url, autocommit=True, row_factory=dict_row
        )

    def close(self) -> None:
        self.conn.close()

    def _rows(self, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        cursor = self.conn.execute(Q[name], params or {})
        return cursor.fetchall() if cursor.description else []

    def insert_task(self, now: datetime, status: str = "Queued", **fields: Any) -> UUID:
        """One task in `status` as of `now`; `fields` override any column."""
        task_id = uuid4()
        values: dict[str, Any] = {
            "task_id": task_id,
            "status": status,
            "queue": "default",
            "operator": "echo",
            "attempt": 1,
            "replay_offset": 0,
            "max_attempts": 3,
            "processing_attempts": 0,
            "max_processing_attempts": 10,
            "on_exhausted": "dead_letter",
            "backoff_base_seconds": 2.0,
            "backoff_max_seconds": 60.0,
            "timeout_seconds": None,
            "lease_token": None,
            "lease_expires_at": None,
            "deadline_at": None,
            "worker_id": None,
            "scheduled_for": None,
            "next_retry_at": None,
            "expires_at": None,
            "queued_at": None,
            "attempt_outcome": None,
            "dead_reason": None,
            "last_error": None,
            "created_at": now,
            "started_at": None,
            "finished_at": None,
        }
        if status == "Scheduled":
            values["scheduled_for"] = now + seconds(60)
        elif status == "Queued":
            values["queued_at"] = now
        elif status in ("Running", "Failed"):
            values.update(
                lease_token=uuid4(),
                lease_expires_at=now + seconds(10),
                deadline_at=now + seconds(3600),
                worker_id="worker-1",
                started_at=now,
                queued_at=now,
            )
            if status == "Failed":
                values.update(
                    lease_expires_at=None,
                    next_retry_at=now + seconds(5),
                    attempt_outcome="Failed",
                    last_error="boom",
                )
        else:
            values["finished_at"] = now
        values.update(fields)
        with self.conn.transaction():
            self._rows("insert_task", values)
            if values["lease_token"] is not None:
                self._rows(
                    "insert_attempt",
                    {
                        "task_id": task_id,
                        "attempt": values["attempt"],
                        "worker_id": values["worker_id"],
                        "lease_token": values["lease_token"],
                        "started_at": values["started_at"],
                        "finished_at": None if status == "Running" else now,
                        "outcome": values["attempt_outcome"],
                    },
                )
        return task_id

    def insert_tasks(self, count: int, now: datetime, status: str, **fields: Any) -> list[UUID]:
        return [self.insert_task(now, status, **fields) for _ in range(count)]

    def insert_output_and_event(self, task_id: UUID, now: datetime) -> None:
        params = {"task_id": task_id, "attempt": 1, "now": now}
        self._rows("insert_output", params)
        self._rows("insert_event", params)

    def insert_outbox(self, task_id: UUID, created_at: datetime, sent_at: datetime | None) -> int:
        rows = self._rows(
            "insert_outbox", {"task_id": task_id, "created_at": created_at, "sent_at": sent_at}
        )
        return int(rows[0]["outbox_id"])

    def finish_running_task(self, task_id: UUID, finished_at: datetime) -> None:
        finished = self._rows(
            "finish_running_task", {"task_id": task_id, "finished_at": finished_at}
        )
        assert finished, "the task was not Running"

    def attempts_closed_with(self, outcome: str, finished_at: datetime) -> int:
        params = {"outcome": outcome, "finished_at": finished_at}
        return int(self._rows("attempts_closed_with", params)[0]["n"])

    def set_queue_paused(self, queue: str, paused: bool) -> None:
        self._rows("set_queue_paused", {"queue": queue, "paused": paused})

    def set_queue_sqs_missing(self, queue: str, missing: bool) -> None:
        self._rows("set_queue_sqs_missing", {"queue": queue, "missing": missing})

    def task(self, task_id: UUID) -> Row:
        rows = self._rows("task_row", {"task_id": task_id})
        assert rows, f"task {task_id} not found"
        return rows[0]

    def task_or_none(self, task_id: UUID) -> Row | None:
        rows = self._rows("task_row", {"task_id": task_id})
        return rows[0] if rows else None

    def attempts(self, task_id: UUID) -> list[Row]:
        return self._rows("attempt_rows", {"task_id": task_id})

    def outbox(self, task_id: UUID) -> list[Row]:
        return self._rows("outbox_rows", {"task_id": task_id})

    def all_outbox(self) -> list[Row]:
        return self._rows("all_outbox_rows")

    def all_tasks(self) -> list[Row]:
        return self._rows("all_tasks")

    def counts(self) -> dict[str, int]:
        return {key: int(value) for key, value in self._rows("row_counts")[0].items()}


def run_replicas(replicas: list[Callable[[], Any]], *, timeout: float = 60) -> list[list[Any]]:
    """Run each replica's `run_once` repeatedly, all at once, until a pass of every one finds
    nothing left; returns each replica's results. Exceptions in a replica fail the caller."""
    barrier = threading.Barrier(len(replicas))
    results: list[list[Any]] = [[] for _ in replicas]
    errors: list[BaseException] = []

    def drive(index: int) -> None:
        try:
            barrier.wait(timeout=timeout)
            while True:
                result = replicas[index]()
                results[index].append(result)
                if not _did_something(result):
                    return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(replicas))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
        assert not thread.is_alive(), "a replica did not finish"
    if errors:
        raise errors[0]
    return results


def _did_something(result: Any) -> bool:
    values = vars(result)
    return any(value for key, value in values.items() if key != "more")


class LoopProcess:
    """A loop service run as a real process (`python -m <module>`), its stderr collected."""

    def __init__(self, module: str, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def logged(self, event: str) -> bool:
        return any(f'"event": "{event}"' in line for line in list(self.lines))

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines so far, parsed (other lines are skipped)."""
        parsed: list[dict[str, Any]] = []
        for line in list(self.lines):
            if line.startswith("{"):
                with suppress(ValueError):
                    parsed.append(json.loads(line))
        return parsed

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, then the exit code (the process is killed if it does not stop in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise
        self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


def metric_lines(text: bytes | str) -> set[str]:
    """The sample lines of a Prometheus text exposition (comments dropped)."""
    if isinstance(text, bytes):
        text = text.decode()
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def ops_get(port: int, path: str) -> httpx.Response | None:
    """GET a loop's ops endpoint; None while nothing answers on `port`."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except httpx.TransportError:
        return None


def ops_status(port: int) -> int | None:
    """The `/healthz` status code of the ops server on `port` (None: not answering)."""
    response = ops_get(port, "/healthz")
    return response.status_code if response is not None else None


def run_with_bad_settings(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
