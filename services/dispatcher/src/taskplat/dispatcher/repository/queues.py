"""The queue registry, bulk replay and the dashboard's figures of `queues.sql`.

Invariants: functions take the caller's connection and never commit; pause and resume are guarded
single-row updates; a bulk replay moves only rows it locked as Dead or Canceled and writes their
enqueue_task outbox rows in the same statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.dispatcher.repository", "queues.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


async def _all(conn: Conn, name: str, params: dict[str, Any]) -> list[Row]:
    cursor = await conn.execute(Q[name], params)
    return await cursor.fetchall()


async def register_queues(conn: Conn, names: Sequence[str], now: datetime | None) -> None:
    await conn.execute(Q["register_queues"], {"names": list(names), "now": now})


async def mark_claimed_ahead(conn: Conn, name: str, now: datetime | None) -> None:
    await conn.execute(Q["mark_claimed_ahead"], {"name": name, "now": now})


async def mark_polled(conn: Conn, name: str, seconds: float, now: datetime | None) -> None:
    await conn.execute(Q["mark_polled"], {"name": name, "seconds": seconds, "now": now})


async def known_queues(conn: Conn) -> list[str]:
    return [row["name"] for row in await _all(conn, "known_queues", {})]


async def list_queues(conn: Conn, now: datetime | None) -> list[Row]:
    return await _all(conn, "list_queues", {"now": now})


async def set_queue_limits(
    conn: Conn,
    name: str,
    *,
    concurrency_limit: int | None,
    key_concurrency_limit: int | None,
    rate_per_second: float | None,
    rate_burst: int | None,
    now: datetime | None,
) -> None:
    """Replace the queue's limits (registering it if new) and recount its Running tasks."""
    params = {
        "name": name,
        "concurrency_limit": concurrency_limit,
        "key_concurrency_limit": key_concurrency_limit,
        "rate_per_second": rate_per_second,
        "rate_burst": rate_burst,
        "now": now,
    }
    await conn.execute(Q["set_queue_limits"], params)


async def sqs_missing_queues(conn: Conn) -> int:
    """How many queues the relay holds because their SQS queue does not exist."""
    rows = await _all(conn, "sqs_missing_queues", {})
    return int(rows[0]["queues"])


async def set_paused(conn: Conn, name: str, now: datetime | None) -> bool | None:
    """Pause a queue: whether it was running before, None when it is not registered."""
    rows = await _all(conn, "pause_queue", {"name": name, "now": now})
    return None if not rows else not rows[0]["was_paused"]


async def resume(conn: Conn, name: str, now: datetime | None, limit: int) -> tuple[bool, int]:
    """Resume a paused queue and re-announce up to `limit` of its Queued tasks:
    (it was paused, tasks re-announced)."""
    rows = await _all(conn, "resume_queue", {"name": name, "now": now, "limit": limit})
    return bool(rows[0]["resumed"]), int(rows[0]["announced"])


async def queue_exists(conn: Conn, name: str) -> bool:
    return bool(await _all(conn, "queue_exists", {"name": name}))


async def pick_replayable(
    conn: Conn, *, ids: Sequence[UUID] | None, filters: dict[str, Any], limit: int
) -> list[UUID]:
    """Lock the Dead or Canceled tasks named by `ids`, or chosen by `filters`, up to `limit`."""
    params = {
        "ids": list(ids) if ids is not None else None,
        "status": None,
        "queue": None,
        "operator": None,
        "dag": None,
        "job": None,
        **filters,
        "limit": limit,
    }
    return [row["task_id"] for row in await _all(conn, "pick_replayable", params)]


async def replay_tasks(
    conn: Conn,
    ids: Sequence[UUID],
    *,
    now: datetime | None,
    trace_context: dict[str, str] | None,
) -> list[Row]:
    """Replay the picked tasks `ids` (locked by `pick_replayable`), each with its wake-up."""
    params = {
        "ids": list(ids),
        "now": now,
        "trace_context": Jsonb(trace_context) if trace_context else None,
    }
    return await _all(conn, "replay_tasks", params)


async def existing_tasks(conn: Conn, ids: Sequence[UUID]) -> set[UUID]:
    return {row["task_id"] for row in await _all(conn, "existing_tasks", {"ids": list(ids)})}


async def notify_queues(conn: Conn, queues: Sequence[str]) -> None:
    await conn.execute(Q["notify_outbox"], {"queues": list(queues)})


async def state_counts(conn: Conn, now: datetime | None) -> list[Row]:
    return await _all(conn, "state_counts", {"now": now})


async def throughput(conn: Conn, now: datetime | None) -> list[Row]:
    return await _all(conn, "throughput", {"now": now})
