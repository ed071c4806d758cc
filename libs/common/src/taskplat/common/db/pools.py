"""psycopg-pool helpers for the dispatcher (async) and the loops (sync).

Invariants: pooled connections are in autocommit mode (a multi-statement write opens
`conn.transaction()` explicitly); every pooled connection uses UTC, a statement timeout and an
application name, so a stuck query cannot hold a connection forever and server logs say which
service ran it. Pools are created closed; the owner opens and closes them (the dispatcher in its
lifespan, loops in `__main__`).
"""

from __future__ import annotations

from psycopg import AsyncConnection, Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from taskplat.common.settings import DatabaseSettings

DEFAULT_STATEMENT_TIMEOUT_MS = 30_000


def _connect_kwargs(application_name: str, statement_timeout_ms: int) -> dict[str, object]:
    return {
        "application_name": application_name,
        "options": f"-c timezone=UTC -c statement_timeout={statement_timeout_ms}",
        "row_factory": dict_row,
        "autocommit": True,
    }


def make_async_pool(
    settings: DatabaseSettings,
    *,
    application_name: str,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
) -> AsyncConnectionPool[AsyncConnection[DictRow]]:
    return AsyncConnectionPool(
        settings.database_url.get_secret_value(),
        connection_class=AsyncConnection[DictRow],
        kwargs=_connect_kwargs(application_name, statement_timeout_ms),
        min_size=settings.db_pool_min_size,
        max_size=settings.db_pool_max_size,
        timeout=settings.db_connect_timeout_seconds,
        open=False,
        name=application_name,
    )


def make_pool(
    settings: DatabaseSettings,
    *,
    application_name: str,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
) -> ConnectionPool[Connection[DictRow]]:
    return ConnectionPool(
        settings.database_url.get_secret_value(),
        connection_class=Connection[DictRow],
        kwargs=_connect_kwargs(application_name, statement_timeout_ms),
        min_size=settings.db_pool_min_size,
        max_size=settings.db_pool_max_size,
        timeout=settings.db_connect_timeout_seconds,
        open=False,
        name=application_name,
    )
