"""API keys, the audit log and the workers of `access.sql`.

Invariants: functions take the caller's connection and never commit (an audit row is written in
the transaction of the change it records); keys are stored and found by the sha256 of their
secret, never the secret; a worker's row is one upsert per report.
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

Q = load_queries("taskplat.dispatcher.repository", "access.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


async def find_key(conn: Conn, key_hash: bytes) -> Row | None:
    cursor = await conn.execute(Q["find_key"], {"key_hash": key_hash})
    return await cursor.fetchone()


async def insert_key(
    conn: Conn,
    *,
    name: str,
    key_hash: bytes,
    scopes: Sequence[str],
    created_by: str,
    now: datetime | None,
) -> Row | None:
    """The new key's row; None when a key of this name exists."""
    params = {
        "name": name,
        "key_hash": key_hash,
        "scopes": list(scopes),
        "created_by": created_by,
        "now": now,
    }
    cursor = await conn.execute(Q["insert_key"], params)
    return await cursor.fetchone()


async def list_keys(conn: Conn) -> list[Row]:
    cursor = await conn.execute(Q["list_keys"])
    return await cursor.fetchall()


async def delete_key(conn: Conn, name: str) -> bool:
    cursor = await conn.execute(Q["delete_key"], {"name": name})
    return await cursor.fetchone() is not None


async def insert_audit(
    conn: Conn,
    *,
    key_name: str,
    action: str,
    target: str | None,
    outcome: str,
    detail: dict[str, Any] | None,
    now: datetime | None,
) -> None:
    params = {
        "key_name": key_name,
        "action": action,
        "target": target,
        "outcome": outcome,
        "detail": Jsonb(detail) if detail is not None else None,
        "now": now,
    }
    await conn.execute(Q["insert_audit"], params)


async def list_audit(conn: Conn, params: dict[str, Any]) -> list[Row]:
    cursor = await conn.execute(Q["list_audit"], params)
    return await cursor.fetchall()


async def upsert_worker(
    conn: Conn,
    *,
    worker_id: str,
    queues: Sequence[str],
    slots: int,
    version: str,
    running: Sequence[UUID],
    now: datetime | None,
) -> None:
    params = {
        "worker_id": worker_id,
        "queues": list(queues),
        "slots": slots,
        "version": version,
        "running": list(running),
        "now": now,
    }
    await conn.execute(Q["upsert_worker"], params)


async def list_workers(
    conn: Conn, *, seen_within_seconds: float, limit: int, now: datetime | None
) -> list[Row]:
    params = {"seen_within_seconds": seen_within_seconds, "limit": limit, "now": now}
    cursor = await conn.execute(Q["list_workers"], params)
    return await cursor.fetchall()


async def prune_workers(conn: Conn, *, older_than_seconds: float, now: datetime | None) -> None:
    await conn.execute(Q["prune_workers"], {"older_than_seconds": older_than_seconds, "now": now})


async def register_queue(conn: Conn, name: str, now: datetime | None) -> bool:
    """True when the queue is new."""
    cursor = await conn.execute(Q["register_queue"], {"name": name, "now": now})
    return await cursor.fetchone() is not None


async def workers_per_queue(
    conn: Conn, *, seen_within_seconds: float, now: datetime | None
) -> list[Row]:
    params = {"seen_within_seconds": seen_within_seconds, "now": now}
    cursor = await conn.execute(Q["workers_per_queue"], params)
    return await cursor.fetchall()
