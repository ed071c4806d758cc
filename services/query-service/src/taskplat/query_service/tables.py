"""The trusted side's reads of a query's inputs, as Arrow tables for its sandbox.

Invariants:
  * Only the inputs the statement reads (`guard.Checked.views`) are read, each exactly at the
    table or S3 prefix its pinned version names (`inputs.lookup`): a Postgres input through a
    cursor `taskplat_query_open` opens on the service's own pool (the `taskplat_query` login has
    no right on any table; the function checks again that the token's attempt is running and its
    task pins that version), an S3 input with the credentials of the token narrowed to its input
    prefixes (`s3access`).
  * Column types follow what DuckDB's Postgres scanner gave: integers, booleans, floats, text,
    dates and timestamps keep their type; `numeric` is a DOUBLE; `json`/`jsonb`, `uuid` and any
    other type arrive as text.
  * An input over `max_input_bytes` (Arrow bytes) is refused (`InputTooLarge`) before more of it is
    read: the service holds each input in memory while its query runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
from botocore.config import Config
from psycopg import sql
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool

from taskplat.common.errors import TaskplatError, ValidationFailed
from taskplat.common.tokens.capability import split_s3_uri
from taskplat.query_service.inputs import AttemptNotRunning, InputView
from taskplat.query_service.s3access import S3Credentials

FETCH_ROWS = 5000
# Postgres type oid -> Arrow type; any other type arrives as text.
ARROW_TYPES: dict[int, pa.DataType] = {
    16: pa.bool_(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    700: pa.float32(),
    701: pa.float64(),
    1700: pa.float64(),
    25: pa.string(),
    1043: pa.string(),
    1082: pa.date32(),
    1083: pa.time64("us"),
    1114: pa.timestamp("us"),
    1184: pa.timestamp("us", tz="UTC"),
    17: pa.binary(),
}


class InputUnreadable(TaskplatError):
    code = "input_unreadable"


class InputTooLarge(ValidationFailed):
    code = "input_too_large"


def _column(values: list[Any], oid: int) -> pa.Array:
    kind = ARROW_TYPES.get(oid)
    if kind is None:
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())
    if oid == 1700:
        values = [None if v is None else float(v) for v in values]
    return pa.array(values, type=kind)


def postgres_table(pool: ConnectionPool[Any], view: InputView, max_bytes: int) -> pa.Table:
    """The whole table of `view`'s pinned version, while the attempt reading it runs."""
    assert view.table_name is not None
    batches: list[pa.RecordBatch] = []
    size = 0
    with pool.connection() as conn, conn.transaction(), conn.cursor() as cursor:
        for name in ("json", "jsonb", "uuid"):  # text in the end: never parsed
            cursor.adapters.register_loader(name, TextLoader)
        opened = cursor.execute(
            "SELECT taskplat_query_open(%s, %s, %s, %s)",
            (view.task_id, view.attempt, view.dataset_uuid, view.dataset_version),
        ).fetchone()
        if opened is None or opened[0] is None:
            raise AttemptNotRunning(
                f"attempt {view.attempt} of task {view.task_id} is no longer running: "
                f"input {view.name} ({view.dataset_uuid}) is not read"
            )
        portal = sql.Identifier(opened[0])
        fetch = sql.SQL("FETCH {} FROM {}").format(sql.Literal(FETCH_ROWS), portal)
        names: list[str] = []
        oids: list[int] = []
        while True:
            cursor.execute(fetch)
            description = cursor.description or []
            names = [column.name for column in description]
            oids = [column.type_code for column in description]
            rows = cursor.fetchall()
            if not rows:
                break
            columns = list(zip(*rows, strict=True))
            batch = pa.RecordBatch.from_arrays(
                [_column(list(c), oid) for c, oid in zip(columns, oids, strict=True)], names=names
            )
            size += batch.nbytes
            if size > max_bytes:
                raise _too_large(view, max_bytes)
            batches.append(batch)
            if len(rows) < FETCH_ROWS:
                break  # the cursor is spent: no FETCH for an empty answer
    schema = pa.schema(
        [pa.field(n, ARROW_TYPES.get(oid, pa.string())) for n, oid in zip(names, oids, strict=True)]
    )
    return pa.Table.from_batches(batches, schema=schema)


def _too_large(view: InputView, max_bytes: int) -> InputTooLarge:
    return InputTooLarge(
        f"input {view.name} ({view.dataset_uuid}) is over {max_bytes} bytes, the most one query "
        "may read"
    )


class S3Reader:
    """Parquet objects under a prefix, read with one token's narrowed credentials."""

    def __init__(self, endpoint_url: str | None, region: str, max_clients: int = 256) -> None:
        self._endpoint_url = endpoint_url
        self._region = region
        self._max_clients = max_clients
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _client(self, credentials: S3Credentials) -> Any:
        with self._lock:
            client = self._clients.get(credentials.access_key_id)
        if client is not None:
            return client
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=self._endpoint_url,
            region_name=self._region,
            aws_access_key_id=credentials.access_key_id,
            aws_secret_access_key=credentials.secret_access_key,
            aws_session_token=credentials.session_token,
            config=Config(
                retries={"max_attempts": 3, "mode": "standard"}, s3={"addressing_style": "path"}
            ),
        )
        with self._lock:
            if len(self._clients) >= self._max_clients:
                self._clients.clear()
            self._clients[credentials.access_key_id] = client
        return client

    def table(self, view: InputView, credentials: S3Credentials, max_bytes: int) -> pa.Table:
        """Every Parquet object under `view`'s pinned prefix, as one table."""
        assert view.s3_prefix is not None
        client = self._client(credentials)
        bucket, prefix = split_s3_uri(view.s3_prefix)
        tables: list[pa.Table] = []
        size = 0
        for key in _parquet_keys(client, bucket, prefix):
            data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            table = pq.read_table(pa.BufferReader(data))
            size += table.nbytes
            if size > max_bytes:
                raise _too_large(view, max_bytes)
            tables.append(table)
        if not tables:
            raise InputUnreadable(
                f"input {view.name} ({view.dataset_uuid}) cannot be read: no Parquet object "
                f"under {view.s3_prefix}"
            )
        return pa.concat_tables(tables, promote_options="default")


def _parquet_keys(client: Any, bucket: str, prefix: str) -> Iterator[str]:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents") or []:
            key = str(item["Key"])
            if key.endswith(".parquet"):
                yield key
