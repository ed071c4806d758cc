"""The audit log of `operate` and `admin` calls: who, what, on what, when, with what outcome.

Invariants: the route wrapper opens an `AuditCall` (the key's name, the route's name, the path's
target) for every call whose route needs `operate` or `admin`; the code that makes the call's
change writes the row with `record(conn, ...)` inside that change's own transaction, so a call
that fails (and rolls back) leaves no row, and a row never describes a change that did not
commit. A successful such call that wrote no row is a bug, logged as `audit_missing`.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from taskplat.dispatcher.repository import access as repo

Conn = AsyncConnection[DictRow]


@dataclass
class AuditCall:
    key_name: str
    action: str
    target: str | None
    recorded: int = 0


_CURRENT: ContextVar[AuditCall | None] = ContextVar("taskplat_audit_call", default=None)


def begin(call: AuditCall) -> object:
    """Make `call` the audited call of this request; the token resets it."""
    return _CURRENT.set(call)


def end(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]


def current() -> AuditCall | None:
    return _CURRENT.get()


async def record(
    conn: Conn,
    outcome: str,
    *,
    target: str | None = None,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    """Write the audit row of the current call in `conn`'s open transaction (no call: nothing)."""
    call = _CURRENT.get()
    if call is None:
        return
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
