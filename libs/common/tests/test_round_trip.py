"""`transaction_in_one_round_trip` on a real Postgres: the statements commit together and answer
their rows; an error in any of them commits nothing and leaves the connection usable; BEGIN,
the statements and COMMIT reach the server as one transaction."""

from __future__ import annotations

import asyncio
import itertools
import os

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus

from taskplat.common.db.round_trip import pipelined_transaction, transaction_in_one_round_trip

_tables = itertools.count()


def _table() -> str:
    return f"tp_round_trip_{os.getpid()}_{next(_tables)}"


def _run(database_url: str, table: str, second: str) -> tuple[object, int, TransactionStatus]:
    """Insert 1 then run `second` in one round trip; (its answer or the error raised, the rows
    committed, the connection's state after)."""

    async def go() -> tuple[object, int, TransactionStatus]:
        async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(f"CREATE TABLE {table} (n integer PRIMARY KEY)")  # type: ignore[arg-type]
            answer: object
            try:
                answer = await transaction_in_one_round_trip(
                    conn,
                    [
                        (f"INSERT INTO {table} VALUES (1) RETURNING n", {}),  # type: ignore[list-item]
                        (second, {"table": table}),  # type: ignore[list-item]
                    ],
                )
            except psycopg.Error as exc:
                answer = exc
            state = conn.info.transaction_status
            cursor = await conn.execute(f"SELECT count(*) FROM {table}")  # type: ignore[arg-type]
            row = await cursor.fetchone()
            await conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]
            assert row is not None
            return answer, int(row[0]), state

    return asyncio.run(go())


def test_the_statements_commit_together_and_answer_their_rows(database_url: str) -> None:
    table = _table()
    answer, committed, state = _run(
        database_url,
        table,
        # Sees the first statement's row: the same transaction, in order.
        f"SELECT count(*) AS seen, txid_current_if_assigned() IS NOT NULL AS one FROM {table}",
    )
    assert answer == [[(1,)], [(1, True)]]
    assert committed == 1
    assert state == TransactionStatus.IDLE


def test_an_error_in_any_statement_commits_nothing(database_url: str) -> None:
    table = _table()
    answer, committed, state = _run(database_url, table, f"INSERT INTO {table} VALUES (1)")
    assert isinstance(answer, psycopg.errors.UniqueViolation)
    assert committed == 0  # the first insert was rolled back with the second
    assert state == TransactionStatus.IDLE  # and the connection is usable


def test_it_refuses_a_connection_inside_a_transaction(database_url: str) -> None:
    async def go() -> None:
        async with await AsyncConnection.connect(database_url) as conn:  # not autocommit
            with pytest.raises(ValueError, match="idle autocommit"):
                await transaction_in_one_round_trip(conn, [("SELECT 1", {})])

    asyncio.run(go())


def test_an_error_raised_in_the_block_commits_nothing(database_url: str) -> None:
    table = _table()

    async def go() -> tuple[int, int, TransactionStatus]:
        async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(f"CREATE TABLE {table} (n integer)")  # type: ignore[arg-type]
            with pytest.raises(RuntimeError):
                async with pipelined_transaction(conn):
                    cursor = await conn.execute(f"INSERT INTO {table} VALUES (1) RETURNING n")  # type: ignore[arg-type]
                    seen = await cursor.fetchall()  # read mid-block: BEGIN and the insert went
                    raise RuntimeError("the caller gives up")
            state = conn.info.transaction_status
            cursor = await conn.execute(f"SELECT count(*) FROM {table}")  # type: ignore[arg-type]
            row = await cursor.fetchone()
            await conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]
            assert row is not None
            return len(seen), int(row[0]), state

    read, committed, state = asyncio.run(go())
    assert (read, committed, state) == (1, 0, TransactionStatus.IDLE)
