"""Tables and buffers of buffered Postgres datasets (`buffered.sql`) and the DDL of their tables.

Invariants: functions take the caller's connection and never commit; a caller holds the dataset
row's lock. A table is created, named and recorded by `taskplat_add_dataset_table` (migration
0022), which creates it through `taskplat_create_dataset_table` (migration 0009: it runs as the
schema owner, since the services' role holds no DDL rights, and refuses names and types outside the
same allow-list as `taskplat.common.buffered.full_schema`, which the columns already passed); a
table is created once and never altered. Reads of a table name it through `psycopg.sql`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, sql
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from taskplat.common.buffered import Column, schema_hash
from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.dispatcher.repository", "buffered.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


async def current_table(conn: Conn, dataset_uuid: UUID) -> Row | None:
    cursor = await conn.execute(Q["current_table"], {"dataset_uuid": dataset_uuid})
    return await cursor.fetchone()


async def create_table(
    conn: Conn,
    dataset_uuid: UUID,
    dataset_version: UUID,
    columns: list[Column],
    now: datetime | None,
) -> str:
    """Create the table of `dataset_version` and record it; the dataset's location names it, and
    the dataset has its buffer row (taskplat_add_dataset_table, migration 0022). Returns the
    table's name."""
    described = Jsonb([{"name": c.name, "type": c.type} for c in columns])
    params = {
        "dataset_uuid": dataset_uuid,
        "dataset_version": dataset_version,
        "columns": described,
        "schema_hash": schema_hash(columns),
        "now": now,
    }
    cursor = await conn.execute(Q["add_table"], params)
    row = await cursor.fetchone()
    assert row is not None
    name: str = row["table_name"]
    return name


async def buffered_view(conn: Conn, dataset_uuid: UUID) -> Row | None:
    """{schema, schema_hash, buffer_queue_url, row_count} of the current version's table."""
    cursor = await conn.execute(Q["buffered_view"], {"dataset_uuid": dataset_uuid})
    row = await cursor.fetchone()
    if row is None:
        return None
    count = await conn.execute(
        sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(row["table_name"]))
    )
    counted = await count.fetchone()
    assert counted is not None
    return {
        "schema": row["columns"],
        "schema_hash": row["schema_hash"],
        "buffer_queue_url": row["queue_url"],
        "row_count": int(counted["n"]),
    }
