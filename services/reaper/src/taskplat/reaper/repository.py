"""The reaper's statements (`reaper.sql`).

Invariants: each function runs one statement over at most `limit` rows and returns what it changed;
a transition is guarded by the status, attempt and lease token it selected, so it never overwrites
a completion, a heartbeat or another replica's transition. Functions take the caller's connection
and never commit: the caller owns the transaction and sends `notify_outbox` in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from psycopg import Connection
from psycopg.rows import DictRow

from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.reaper", "reaper.sql")

Conn = Connection[DictRow]
Row = dict[str, Any]


def _rows(conn: Conn, name: str, params: dict[str, Any]) -> list[Row]:
    return conn.execute(Q[name], params).fetchall()


def reap_timeouts(
    conn: Conn,
    *,
    now: datetime | None,
    limit: int,
    grace_seconds: float,
    jitters: Sequence[float],
) -> list[Row]:
    """Running tasks whose lease ran out (`LeaseExpired`) or that ran past `deadline_at +
    grace_seconds` (`DeadlineExceeded`) -> Failed (retry with backoff) or Dead.

    `jitters` holds one uniform [0, 1) draw per possible row (at least `limit` values).
    Returns `task_id, attempt, status, queue, operator, worker_id, dead_reason, next_retry_at,
    ended` per reaped task (`ended`: LeaseExpired or DeadlineExceeded).
    """
    return _rows(
        conn,
        "reap_timeouts",
        {"now": now, "limit": limit, "grace_seconds": grace_seconds, "jitters": list(jitters)},
    )


def expire_unstarted(conn: Conn, *, now: datetime | None, limit: int) -> list[Row]:
    """Queued or Scheduled tasks past `expires_at` -> Dead (Expired), each with a dead letter.

    Returns `task_id, attempt, status, queue, operator, dead_reason, expired_from` per task.
    """
    return _rows(conn, "expire_unstarted", {"now": now, "limit": limit})


def prune_finished_tasks(
    conn: Conn, *, now: datetime | None, limit: int, retention_seconds: float
) -> int:
    """Delete terminal tasks finished before now - retention (cascading); returns the count."""
    rows = _rows(
        conn,
        "prune_finished_tasks",
        {"now": now, "limit": limit, "retention_seconds": retention_seconds},
    )
    return len(rows)


def prune_sent_outbox(
    conn: Conn, *, now: datetime | None, limit: int, retention_seconds: float
) -> int:
    """Delete outbox rows sent before now - retention; returns the count."""
    rows = _rows(
        conn,
        "prune_sent_outbox",
        {"now": now, "limit": limit, "retention_seconds": retention_seconds},
    )
    return len(rows)


def notify_outbox(conn: Conn, queues: Iterable[str]) -> None:
    """NOTIFY the relay once per queue written (delivered when the transaction commits)."""
    distinct = sorted(set(queues))
    if distinct:
        conn.execute(Q["notify_outbox"], {"queues": distinct})
