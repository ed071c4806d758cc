"""Transactions whose BEGIN and COMMIT cost no round trip of their own (psycopg's pipeline mode).

psycopg's `transaction()` waits for BEGIN and for COMMIT, each a round trip of its own (in a
pipeline too, as it syncs after them); on an idle machine every round trip wakes Postgres up
again. In `pipelined_transaction`, BEGIN goes to Postgres with the block's first statement whose
rows are read, and COMMIT with whatever the block sent after its last read: a block that reads
once at its end is one round trip (`transaction_in_one_round_trip`).

Invariants:
  * Either every statement of the block commits, or none does: they run in the order sent
    inside one BEGIN ... COMMIT. After an error Postgres skips the rest, COMMIT included; the
    transaction is rolled back here and the error raised. A statement's rows read after the
    block ended were read with the COMMIT's answer, so they are committed.
  * Only on a connection in autocommit mode and outside any transaction (else `ValueError`):
    inside a caller's transaction use `conn.transaction()` (a savepoint) instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, LiteralString

from psycopg import AsyncConnection, AsyncCursor
from psycopg.pq import TransactionStatus

Statement = tuple[LiteralString, dict[str, Any]]
_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


@asynccontextmanager
async def pipelined_transaction(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """A transaction on `conn` in pipeline mode: statements executed in the block are sent at
    once, and read (a cursor's fetch) when their rows are needed; the block's end commits."""
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("a pipelined transaction needs an idle autocommit connection")
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            yield
            await conn.execute("COMMIT")
    except Exception:
        if conn.info.transaction_status in _OPEN:  # an error before COMMIT, or in it
            await conn.execute("ROLLBACK")
        raise


async def send(
    conn: AsyncConnection[Any], statements: Sequence[Statement]
) -> list[AsyncCursor[Any]]:
    """Execute `statements` (query, parameters) in order without reading their rows (in a
    pipeline they go to Postgres together); their cursors, for `rows_of`."""
    return [await conn.execute(query, params) for query, params in statements]


async def rows_of(cursors: Sequence[AsyncCursor[Any]]) -> list[list[Any]]:
    """The rows of each cursor, in order (none for a statement that returns no rows)."""
    return [await cursor.fetchall() if cursor.description else [] for cursor in cursors]


async def transaction_in_one_round_trip(
    conn: AsyncConnection[Any], statements: Sequence[Statement]
) -> list[list[Any]]:
    """Run `statements` (query, parameters) in one transaction sent as one round trip; the rows
    of each, in order, once committed."""
    async with pipelined_transaction(conn):
        cursors = await send(conn, statements)
    return await rows_of(cursors)
