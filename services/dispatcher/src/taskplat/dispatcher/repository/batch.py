"""Batch statements of `batch.sql`: batch claim, claim-next, batch reads.

Invariants: each function is one statement over several tasks, takes the caller's connection and
never commits; a claim returns exactly the rows it moved to Running (with their attempt records
written by the same statement).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.dispatcher.repository", "batch.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


async def _all(conn: Conn, name: str, params: dict[str, Any]) -> list[Row]:
    cursor = await conn.execute(Q[name], params)
    return await cursor.fetchall()


async def claim_tasks(conn: Conn, params: dict[str, Any]) -> list[Row]:
    """Claim the Queued tasks among `task_ids` (distinct); the claimed rows."""
    return await _all(conn, "claim_tasks", params)


async def complete_many(conn: Conn, params: dict[str, Any]) -> list[Row]:
    """`complete_running` for several completions of distinct tasks, in one statement: the rows
    whose guard matched are locked in task_id order, transitioned, their attempt records closed
    and their events and outputs stored. A Dead row's dead-letter outbox row is not written
    here: the caller writes it in the same transaction. The transitioned rows; a completion
    whose guard did not match wrote nothing."""
    return await _all(conn, "complete_many", params)


async def read_fences(
    conn: Conn,
    task_ids: Sequence[UUID],
    untrusted_operators: Sequence[str],
    now: datetime | None = None,
) -> dict[UUID, Row]:
    """Each task's status, whether its queue is paused, whether it runs untrusted, and the
    limit of its queue that holds it back (with `retry_after_ms`), if any."""
    params = {"task_ids": list(task_ids), "untrusted_operators": list(untrusted_operators),
              "now": now}  # fmt: skip
    rows = await _all(conn, "read_fences", params)
    return {row["task_id"]: row for row in rows}


async def find_tasks_by_idempotency_keys(conn: Conn, keys: Sequence[str]) -> dict[str, UUID]:
    rows = await _all(conn, "find_tasks_by_idempotency_keys", {"keys": list(keys)})
    return {row["idempotency_key"]: row["task_id"] for row in rows}


async def get_tasks(conn: Conn, task_ids: Sequence[UUID]) -> dict[UUID, Row]:
    rows = await _all(conn, "get_tasks", {"task_ids": list(task_ids)})
    return {row["task_id"]: row for row in rows}
