"""Tables and buffers of buffered Postgres datasets (`buffered.sql`) and the DDL of their tables.

Invariants: functions take the caller's connection and never commit; a caller holds the dataset
row's lock. A table's DDL is built only with `psycopg.sql` from names and types that passed
`taskplat.common.buffered.full_schema`'s allow-list; a table is created once and never altered.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, sql
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from taskplat.common.buffered import TYPES, Column, schema_hash, table_name
from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.dispatcher.repository", "buffered.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


def _type(kind: str) -> sql.Composable:
    assert kind in TYPES  # the allow-list; never user text
    return sql.SQL(kind)


def create_table_ddl(name: str, columns: list[Column]) -> sql.Composed:
    """CREATE TABLE of a dataset table: row_id (the event cursor), the columns (org_id and
    dedupe_key NOT NULL) and UNIQUE (org_id, dedupe_key)."""
    definitions: list[sql.Composable] = [
        sql.SQL("row_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY")
    ]
    for column in columns:
        not_null = sql.SQL(" NOT NULL") if column.name in ("org_id", "dedupe_key") else sql.SQL("")
        definitions.append(
            sql.SQL("{} {}{}").format(sql.Identifier(column.name), _type(column.type), not_null)
        )
    definitions.append(sql.SQL("UNIQUE (org_id, dedupe_key)"))
    return sql.SQL("CREATE TABLE {} ({})").format(
        sql.Identifier(name), sql.SQL(", ").join(definitions)
    )


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
    the dataset has its buffer row. Returns the table's name."""
    cursor = await conn.execute(Q["next_ordinal"], {"dataset_uuid": dataset_uuid})
    row = await cursor.fetchone()
    assert row is not None
    name = table_name(dataset_uuid, int(row["ordinal"]))
    await conn.execute(create_table_ddl(name, columns))
    await conn.execute(
        Q["insert_table"],
        {
            "dataset_uuid": dataset_uuid,
            "dataset_version": dataset_version,
            "ordinal": row["ordinal"],
            "table_name": name,
            "columns": Jsonb([{"name": c.name, "type": c.type} for c in columns]),
            "schema_hash": schema_hash(columns),
            "now": now,
        },
    )
    await conn.execute(
        Q["set_location"],
        {"dataset_uuid": dataset_uuid, "location": f"postgres_table:{name}", "now": now},
    )
    await conn.execute(Q["ensure_buffer"], {"dataset_uuid": dataset_uuid, "now": now})
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
