"""The audit log of `operate` and `admin` calls: who, what, on what, when, with what outcome; and
of the calls of those routes that were refused.

Invariants: the route guard makes an `AuditCall` (the key's name, the route's name, the path's
target) for every call whose route needs `operate` or `admin`, and hands it to the handler
explicitly (`audit_call(request)`), which passes it to the code that makes the change: that code
writes the row with `record(conn, call, ...)` inside the change's own transaction, so a call that
fails (and rolls back) leaves no such row, and a row never describes a change that did not
commit. A successful such call that wrote no row is a bug, logged as `audit_missing`.
A refused call of such a route (401 or 403, from the guard or from the handler) is recorded by
`record_refusal` in a transaction of its own, so the rollback of the refused call's transaction
does not take it along; a refusal that cannot be written is logged (`audit_refusal_lost`) and the
caller still gets its 401 or 403, never a 500.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from taskplat.common.logging import get_logger
from taskplat.dispatcher.repository import access as repo

Conn = AsyncConnection[DictRow]
# The key name of a refused call that presented no valid API key (key names cannot hold "(").
NO_KEY = "(no valid key)"


@dataclass
class AuditCall:
    key_name: str
    action: str
    target: str | None
    recorded: int = 0


async def record(
    conn: Conn,
    call: AuditCall,
    outcome: str,
    *,
    target: str | None = None,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    """Write the audit row of `call` in `conn`'s open transaction."""
    await repo.insert_audit(
        conn,
        key_name=call.key_name,
        action=call.action,
        target=target if target is not None else call.target,
        outcome=outcome,
        detail=detail,
        now=now,
    )
    call.recorded += 1


async def record_refusal(
    pool: AsyncConnectionPool[Conn],
    call: AuditCall,
    status: int,
    *,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    """Write the row of a refused call (`refused 401` / `refused 403`) in its own transaction."""
    try:
        async with pool.connection() as conn, conn.transaction():
            await record(conn, call, f"refused {status}", detail=detail, now=now)
    except Exception as exc:  # the refusal stands; losing its row must not turn it into a 500
        get_logger().error(
            "audit_refusal_lost", action=call.action, status=status, error=type(exc).__name__
        )
