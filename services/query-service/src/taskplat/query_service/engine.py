"""The DuckDB of one query, inside a sandbox process: locked down, then the statement, the answer.

Invariants:
  * Every query gets a fresh in-memory DuckDB (`connect`, or a forked copy of one that no query
    has used): nothing of one query is seen by another.
  * It is locked down before any data reaches it: no extension is loaded (parquet, json and icu are
    built into the pinned DuckDB; autoinstall, autoload, community and unsigned extensions are
    off and external access is off, so `LOAD` of anything fails), `allowed_directories` is empty,
    `enable_external_access` is false, Python replacement scans are off and the configuration is
    locked: no file, URL, database or extension can be opened, and no Python variable read.
    The inputs arrive later as Arrow tables registered as views (`sandbox.py`).
  * Rows are read in chunks and the answer stops at `max_rows` rows or `max_bytes` bytes, with
    `truncated` set. The time limit is not kept here: the service kills a sandbox that has not
    answered by its deadline (`pool.py`), and a sandbox serves one query, so no thread of its own
    watches the clock (a timer thread cost each sandbox ~0.7 ms of CPU: docs/performance.md).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from datetime import time as dtime
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

import duckdb
import pyarrow as pa

from taskplat.common.errors import TaskplatError, ValidationFailed

Format = Literal["json", "csv", "arrow"]
CHUNK_ROWS = 1024


class QueryTimeout(TaskplatError):
    code = "query_timeout"


class QueryFailed(ValidationFailed):
    """The statement passed the guard but DuckDB refused or failed it (a bad column, a cast...)."""

    code = "query_failed"


@dataclass(frozen=True)
class Limits:
    max_rows: int
    max_bytes: int
    timeout_seconds: float
    memory_limit: str
    threads: int


@dataclass(frozen=True)
class Answer:
    body: bytes
    media_type: str
    row_count: int
    truncated: bool
    elapsed_ms: float


def open_database(limits: Limits) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB with no extension loading and no replacement scans, on one thread
    (so a process holding it may fork: the sandboxes are forked copies of one never-used
    database). Not yet locked down: `lock_down` does that before it holds any data."""
    return duckdb.connect(
        ":memory:",
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "allow_unsigned_extensions": False,
            "python_enable_replacements": False,
            "memory_limit": limits.memory_limit,
            "threads": 1,
        },
    )


def restrict(conn: duckdb.DuckDBPyConnection) -> None:
    """No directory and no external access (the configuration not yet locked)."""
    conn.execute("SET allowed_directories = []")
    conn.execute("SET enable_external_access = false")


def lock(conn: duckdb.DuckDBPyConnection, limits: Limits) -> None:
    """Its threads (DuckDB starts its workers here: in the process that will run the query,
    as a fork keeps only the forking thread), then the configuration locked."""
    if limits.threads != 1:
        conn.execute(f"SET threads = {int(limits.threads)}")
    conn.execute("SET lock_configuration = true")


def lock_down(conn: duckdb.DuckDBPyConnection, limits: Limits) -> None:
    """`restrict`, then `lock`."""
    restrict(conn)
    lock(conn, limits)


def connect(limits: Limits) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB, locked down before any data or statement reaches it."""
    conn = open_database(limits)
    try:
        lock_down(conn, limits)
    except BaseException:
        conn.close()
        raise
    return conn


def run(
    conn: duckdb.DuckDBPyConnection,
    sql: str,
    params: Sequence[Any] | None,
    limits: Limits,
    max_rows: int,
    fmt: Format,
) -> Answer:
    """Run `sql` on a prepared connection (its time limit is the service's deadline)."""
    started = time.monotonic()
    try:
        relation = conn.sql(sql, params=list(params) if params else None)
        if relation is None:
            raise QueryFailed("the statement returned no rows")
        if fmt == "arrow":
            body, count, truncated = _arrow(relation, max_rows, limits.max_bytes)
            media = "application/vnd.apache.arrow.stream"
        else:
            columns = [
                {"name": n, "type": str(t)}
                for n, t in zip(relation.columns, relation.types, strict=True)
            ]
            if fmt == "csv":
                rows, truncated = _rows(relation, max_rows, limits.max_bytes)
                count = len(rows)
                body, media = _csv(columns, rows), "text/csv; charset=utf-8"
            else:
                text, count, truncated = _json_rows(relation, max_rows, limits.max_bytes)
                elapsed = (time.monotonic() - started) * 1000
                head = json.dumps({"columns": columns}, separators=(",", ":"))[:-1]
                tail = json.dumps(
                    {"row_count": count, "truncated": truncated, "elapsed_ms": round(elapsed, 3)},
                    separators=(",", ":"),
                )[1:]
                body = f'{head},"rows":[{text}],{tail}'.encode()
                media = "application/json"
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0][:500]
        raise QueryFailed(f"the query failed: {first}") from None
    elapsed_ms = (time.monotonic() - started) * 1000
    return Answer(body, media, count, truncated, round(elapsed_ms, 3))


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), default=_jsonable, allow_nan=False)
    except ValueError:  # NaN or an infinity: JSON has no such number, they answer null
        return json.dumps(_finite(value), separators=(",", ":"), default=_jsonable)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _json_rows(
    relation: duckdb.DuckDBPyRelation, max_rows: int, max_bytes: int
) -> tuple[str, int, bool]:
    """The rows as the inside of a JSON array, serialized once per chunk: (text, rows,
    truncated). A chunk that would pass a limit is cut row by row."""
    parts: list[str] = []
    count = size = 0
    while True:
        chunk = relation.fetchmany(min(CHUNK_ROWS, max_rows + 1 - count))
        if not chunk:
            return ",".join(parts), count, False
        text = _dumps(chunk)[1:-1]
        if count + len(chunk) <= max_rows and size + len(text) + 1 <= max_bytes:
            if text:
                parts.append(text)
            count += len(chunk)
            size += len(text) + 1
            continue
        for raw in chunk:
            row = _dumps(raw)
            if count >= max_rows or size + len(row) + 1 > max_bytes:
                return ",".join(parts), count, True
            parts.append(row)
            count += 1
            size += len(row) + 1


def _rows(
    relation: duckdb.DuckDBPyRelation, max_rows: int, max_bytes: int
) -> tuple[list[tuple[Any, ...]], bool]:
    rows: list[tuple[Any, ...]] = []
    size = 0
    while True:
        chunk = relation.fetchmany(min(CHUNK_ROWS, max_rows + 1 - len(rows)))
        if not chunk:
            return rows, False
        for raw in chunk:
            size += sum(len(_csv_value(v)) + 1 for v in raw)
            if len(rows) >= max_rows or size > max_bytes:
                return rows, True
            rows.append(raw)


def _arrow(
    relation: duckdb.DuckDBPyRelation, max_rows: int, max_bytes: int
) -> tuple[bytes, int, bool]:
    reader = relation.fetch_record_batch(CHUNK_ROWS)
    sink = io.BytesIO()
    count, size, truncated = 0, 0, False
    with pa.ipc.new_stream(sink, reader.schema) as writer:
        for batch in reader:
            room = max_rows - count
            if batch.num_rows > room or size + batch.nbytes > max_bytes:
                truncated = True
                keep = min(room, batch.num_rows)
                while keep > 0 and size + batch.slice(0, keep).nbytes > max_bytes:
                    keep //= 2
                if keep > 0:
                    writer.write_batch(batch.slice(0, keep))
                    count += keep
                break
            writer.write_batch(batch)
            count += batch.num_rows
            size += batch.nbytes
    return sink.getvalue(), count, truncated


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime | date | dtime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return str(value)


def _csv(columns: list[dict[str, str]], rows: list[tuple[Any, ...]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c["name"] for c in columns])
    for row in rows:
        writer.writerow([_csv_value(v) for v in row])
    return out.getvalue().encode()


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | dict | tuple):
        return _dumps(value)
    if isinstance(value, bool | int | float | str):
        return str(value)
    return str(_jsonable(value))
