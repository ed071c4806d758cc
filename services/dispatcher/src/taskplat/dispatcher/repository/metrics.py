"""The reads behind the dispatcher's Postgres-derived gauges (`metrics.sql`).

Invariants: read-only; each statement is served by a partial index, so its cost follows the number
of unfinished tasks (and of tasks that died in the last hour), not the size of the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.dispatcher.repository", "metrics.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


@dataclass(frozen=True)
class GaugeRows:
    """One reading of every gauge query."""

    tasks: list[Row]  # queue, status, tasks, oldest_age (Queued only)
    outbox: list[Row]  # kind, pending, oldest_age
    dead_last_hour: list[Row]  # queue, reason, tasks


async def _all(conn: Conn, name: str, now: datetime | None) -> list[Row]:
    cursor = await conn.execute(Q[name], {"now": now})
    return await cursor.fetchall()


async def read_gauges(conn: Conn, now: datetime | None) -> GaugeRows:
    return GaugeRows(
        tasks=await _all(conn, "task_gauges", now),
        outbox=await _all(conn, "outbox_gauges", now),
        dead_last_hour=await _all(conn, "dead_last_hour", now),
    )
