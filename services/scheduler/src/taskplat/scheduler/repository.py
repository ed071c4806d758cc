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


def queue_due(
    conn: Conn, *, now: datetime | None, promote_limit: int, retry_limit: int
) -> list[Row]:
    """Scheduled tasks whose `scheduled_for` has come (up to `promote_limit`) and Failed tasks
    whose `next_retry_at` has come (up to `retry_limit`, as attempt + 1) -> Queued, with a wake-up
    each; `moved_from` says which."""
    return _rows(
        conn,
        "queue_due",
        {"now": now, "promote_limit": promote_limit, "retry_limit": retry_limit},
    )


def republish_unclaimed(
    conn: Conn,
    *,
    now: datetime | None,
    limit: int,
    requeue_after_seconds: float,
    busy_limit: int | None = None,
    closed: Iterable[str] = (),
    busy: Iterable[str] = (),
) -> list[Row]:
    """A fresh wake-up for Queued tasks unclaimed for `requeue_after_seconds`: every such task of
    an idle queue, at most `busy_limit` (None: `limit`) of a queue with a Running task, none of
    a busy queue named in `closed`. A queue is busy when it has a Running task or is named in
    `busy`. Each row also says whether its queue was busy (`busy`)."""
    return _rows(
        conn,
        "republish_unclaimed",
        {
            "now": now,
            "limit": limit,
            "requeue_after_seconds": requeue_after_seconds,
            "busy_limit": limit if busy_limit is None else busy_limit,
            "closed": sorted(set(closed)),
            "busy": sorted(set(busy)),
        },
    )


def busy_queues(conn: Conn) -> list[str]:
    """Queues with a Running task now."""
    return [row["queue"] for row in _rows(conn, "busy_queues", {})]


def notify_outbox(conn: Conn, queues: Iterable[str]) -> None:
    """NOTIFY the relay once per queue written (delivered when the transaction commits)."""
    distinct = sorted(set(queues))
    if distinct:
        conn.execute(Q["notify_outbox"], {"queues": distinct})
