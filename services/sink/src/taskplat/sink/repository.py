"""The sink's rows (`sink.sql`) and the statements on dataset tables.

Invariants: functions take the caller's connection and never commit. A dataset table's name and
columns come from its `dataset_tables` row (checked by the platform's allow-list when the table was
created) and reach SQL only through `psycopg.sql`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection, sql
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from taskplat.common.buffered import TYPES, Column
from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.sink", "sink.sql")

Conn = Connection[DictRow]
Row = dict[str, Any]


def buffers(conn: Conn) -> list[Row]:
    return conn.execute(Q["buffers"]).fetchall()


def set_queue_urls(
    conn: Conn, dataset_uuid: UUID, queue_url: str, dlq_url: str, now: datetime | None
) -> None:
    conn.execute(
        Q["set_queue_urls"],
        {"dataset_uuid": dataset_uuid, "queue_url": queue_url, "dlq_url": dlq_url, "now": now},
    )


def lock_current_table(conn: Conn, dataset_uuid: UUID) -> Row | None:
    return conn.execute(Q["lock_current_table"], {"dataset_uuid": dataset_uuid}).fetchone()


def insert_records(conn: Conn, table: str, columns: list[Column], records: list[Any]) -> int:
    """Insert `records` (checked against `columns`); the number of rows inserted (the others
    were duplicates of (org_id, dedupe_key))."""
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns)
    definitions = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(_type(c.type))) for c in columns
    )
    statement = sql.SQL(
        "INSERT INTO {table} ({names}) SELECT {names} FROM jsonb_to_recordset(%s::jsonb) "
        "AS r({definitions}) ON CONFLICT (org_id, dedupe_key) DO NOTHING"
    ).format(table=sql.Identifier(table), names=names, definitions=definitions)
    cursor = conn.execute(statement, [Jsonb(records)])
    return max(cursor.rowcount, 0)


def high_mark(conn: Conn, table: str) -> int:
    statement = sql.SQL("SELECT coalesce(max(row_id), 0) AS high FROM {}").format(
        sql.Identifier(table)
    )
    row = conn.execute(statement).fetchone()
    assert row is not None
    return int(row["high"])


def store_event(
    conn: Conn,
    *,
    dataset_uuid: UUID,
    dataset_version: UUID,
    cursor: int,
    now: datetime | None,
) -> None:
    conn.execute(
        Q["store_event"],
        {
            "dataset_uuid": dataset_uuid,
            "dataset_version": dataset_version,
            "cursor": cursor,
            "now": now,
        },
    )


def _type(kind: str) -> str:
    if kind not in TYPES:  # the table's own row; never producer input
        raise ValueError(f"unexpected column type {kind!r}")
    return kind
