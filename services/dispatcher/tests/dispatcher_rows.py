"""Test setup and inspection: direct database rows for the dispatcher's tests (not product code).

Invariants: the two `emulate_*` functions stand in for the reaper's lease timeout and the
scheduler's retry promotion (neither loop exists yet); each is one guarded UPDATE naming the status
and attempt it expects, as the real loops must, and returns None when the guard did not match.
They write only what the dispatcher's tests look at: the lease timeout closes the attempt record
but writes no `dead_letter` outbox row; the retry promotion writes its `enqueue_task` row.
Everything else only reads. Each call opens and commits its own connection.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from taskplat.common.db.queries import parse_queries

_SQL_PATH = Path(__file__).with_name("dispatcher_rows.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))

Row = dict[str, Any]


def _rows(db_url: str, name: str, params: dict[str, Any] | None = None) -> list[Row]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        cursor = conn.execute(Q[name], params or {})
        return cursor.fetchall() if cursor.description else []


def emulate_lease_expired(
    db_url: str, task_id: str | UUID, attempt: int, lease_token: str | UUID, now: datetime
) -> str | None:
    """The reaper's lease timeout of `attempt`: Failed (retry due at `now`) or Dead."""
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        params = {"task_id": task_id, "attempt": attempt, "lease_token": lease_token, "now": now}
        row = conn.execute(Q["emulate_lease_expired"], params).fetchone()
        if row is None:
            return None
        conn.execute(Q["emulate_attempt_lease_expired"], params)
        return str(row["status"])


def emulate_retry_promoted(
    db_url: str, task_id: str | UUID, attempt: int, now: datetime
) -> int | None:
    """The scheduler's retry of a Failed `attempt`: Queued as attempt + 1, with an outbox row."""
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        params = {"task_id": task_id, "attempt": attempt, "now": now}
        row = conn.execute(Q["emulate_retry_promoted"], params).fetchone()
        if row is None:
            return None
        conn.execute(Q["emulate_retry_outbox"], {**params, "queue": row["queue"]})
        return int(row["attempt"])


def row_counts(db_url: str) -> dict[str, int]:
    """Rows in every table the dispatcher writes."""
    return {key: int(value) for key, value in _rows(db_url, "row_counts")[0].items()}


def task_row(db_url: str, task_id: str | UUID) -> Row | None:
    rows = _rows(db_url, "task_row", {"task_id": task_id})
    return rows[0] if rows else None


def attempt_rows(db_url: str, task_id: str | UUID) -> list[Row]:
    return _rows(db_url, "attempt_rows", {"task_id": task_id})


def outbox_rows(db_url: str, task_id: str | UUID) -> list[Row]:
    return _rows(db_url, "outbox_rows", {"task_id": task_id})


def event_rows(db_url: str, task_id: str | UUID) -> list[Row]:
    return _rows(db_url, "event_rows", {"task_id": task_id})


def output_rows(db_url: str, task_id: str | UUID) -> list[Row]:
    return _rows(db_url, "output_rows", {"task_id": task_id})


def task_state(db_url: str, task_id: str | UUID) -> dict[str, Any]:
    """Everything stored about one task: compare two readings to prove nothing was written."""
    return {
        "task": task_row(db_url, task_id),
        "attempts": attempt_rows(db_url, task_id),
        "outbox": outbox_rows(db_url, task_id),
        "events": event_rows(db_url, task_id),
        "outputs": output_rows(db_url, task_id),
    }


def task_xmin(db_url: str, task_id: str | UUID) -> str:
    """The id of the transaction that last wrote the task row."""
    return str(_rows(db_url, "task_xmin", {"task_id": task_id})[0]["xmin"])


def outbox_xmins(db_url: str, task_id: str | UUID) -> list[str]:
    """The ids of the transactions that wrote the task's outbox rows, oldest first."""
    return [str(row["xmin"]) for row in _rows(db_url, "outbox_xmins", {"task_id": task_id})]
