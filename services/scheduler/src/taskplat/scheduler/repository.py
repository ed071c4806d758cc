"""The scheduler's statements (`scheduler.sql`).

Invariants: each batch function runs one statement that selects, transitions and writes the outbox
rows of up to `limit` tasks, and returns the moved rows (`task_id`, `attempt` after the move,
`queue`, `operator`); an empty list means nothing was due or every due row was locked by another
replica. Functions take the caller's connection and never commit: the caller owns the transaction
and sends `notify_outbox` in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from psycopg import Connection
from psycopg.rows import DictRow

from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.scheduler", "scheduler.sql")

Conn = Connection[DictRow]
Row = dict[str, Any]


def _rows(conn: Conn, name: str, params: dict[str, Any]) -> list[Row]:
    return conn.execute(Q[name], params).fetchall()


def promote_due_scheduled(conn: Conn, *, now: datetime | None, limit: int) -> list[Row]:
    """Scheduled tasks whose `scheduled_for` has come -> Queued, with a wake-up each."""
    return _rows(conn, "promote_due_scheduled", {"now": now, "limit": limit})


def retry_due_failed(conn: Conn, *, now: datetime | None, limit: int) -> list[Row]:
    """Failed tasks whose `next_retry_at` has come -> Queued as attempt + 1, with a wake-up each."""
    return _rows(conn, "retry_due_failed", {"now": now, "limit": limit})


def republish_unclaimed(
    conn: Conn,
    *,
    now: datetime | None,
    limit: int,
    requeue_after_seconds: float,
    busy_limit: int | None = None,
    closed: Iterable[str] = (),
) -> list[Row]:
    """A fresh wake-up for Queued tasks unclaimed for `requeue_after_seconds`: every such task of
    an idle queue, at most `busy_limit` (None: `limit`) of a queue with a Running task, none of
    a busy queue named in `closed`. Each row also says whether its queue was busy (`busy`)."""
    return _rows(
        conn,
        "republish_unclaimed",
        {
            "now": now,
            "limit": limit,
            "requeue_after_seconds": requeue_after_seconds,
            "busy_limit": limit if busy_limit is None else busy_limit,
            "closed": sorted(set(closed)),
        },
    )


def notify_outbox(conn: Conn, queues: Iterable[str]) -> None:
    """NOTIFY the relay once per queue written (delivered when the transaction commits)."""
    distinct = sorted(set(queues))
    if distinct:
        conn.execute(Q["notify_outbox"], {"queues": distinct})
