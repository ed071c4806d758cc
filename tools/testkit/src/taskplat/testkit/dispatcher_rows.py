"""Test setup and inspection: direct database rows for the dispatcher's tests (not product code).

Invariants: `reap_timeout` and `promote_retry` run the reaper's and the scheduler's transitions
(the SQL functions their statements call, `taskplat_reap_timeouts` and `taskplat_queue_due`,
migration 0020) to reach the states the API cannot (a timed-out attempt, a newer attempt started
by a retry). Those statements work on due batches; to confine one to the task named, every
other task row is locked by a second transaction for the duration, and their `SKIP LOCKED`
selection passes them by. Everything else only reads. Each call commits its own connection.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, LiteralString
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


def _only(
    db_url: str, task_id: str | UUID, query: LiteralString, params: dict[str, Any]
) -> Row | None:
    """Run another service's batch statement with every task but `task_id` locked away."""
    with psycopg.connect(db_url, row_factory=dict_row) as others:
        others.execute(Q["lock_other_tasks"], {"task_id": task_id})
        with psycopg.connect(db_url, row_factory=dict_row) as conn:
            moved = conn.execute(query, params).fetchall()
        others.rollback()
    assert all(str(row["task_id"]) == str(task_id) for row in moved), moved
    return moved[0] if moved else None


def reap_timeout(
    db_url: str, task_id: str | UUID, attempt: int, lease_token: str | UUID, now: datetime
) -> str | None:
    """The reaper's timeout of the task's `attempt` at `now` (its lease must have run out):
    Failed (retry due at `now`: the jitter is 0) or Dead; None when it was not timed out."""
    row = _only(
        db_url,
        task_id,
        Q["reap_timeouts"],
        {"now": now},
    )
    if row is None:
        return None
    assert (row["attempt"], row["ended"]) == (attempt, "LeaseExpired"), row
    return str(row["status"])


def promote_retry(db_url: str, task_id: str | UUID, attempt: int, now: datetime) -> int | None:
    """The scheduler's retry of the task's Failed `attempt` at `now`: Queued as attempt + 1 with
    its wake-up; returns the new attempt, or None when it was not due."""
    row = _only(
        db_url,
        task_id,
        Q["queue_due"],
        {"now": now},
    )
    if row is None:
        return None
    assert (row["attempt"], row["moved_from"]) == (attempt + 1, "Failed"), row
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


def task_pins(db_url: str, task_id: str | UUID) -> list[tuple[str, str]]:
    """The task's pins as (dataset_uuid, dataset_version), by dataset."""
    rows = _rows(db_url, "pin_rows", {"task_id": task_id})
    return [(row["dataset_uuid"], row["dataset_version"]) for row in rows]


def outbox_xmins(db_url: str, task_id: str | UUID) -> list[str]:
    """The ids of the transactions that wrote the task's outbox rows, oldest first."""
    return [str(row["xmin"]) for row in _rows(db_url, "outbox_xmins", {"task_id": task_id})]
