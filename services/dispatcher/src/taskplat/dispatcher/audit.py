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
Refusal rows are bounded per replica (`RefusalThrottle`): at most `per_minute` rows a minute for
one (key name, route, status), so a flood of refused calls cannot flood the table; the refusals
left out are counted, logged (`audit_refusals_suppressed`) and named on the next row written for
that (key, route, status) (`detail.suppressed`). The caller's answer never depends on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


class RefusalThrottle:
    """At most `per_minute` refusal rows a minute per (key name, route, status), in one replica.

    A fixed one-minute window per triple; the dictionary is emptied when it holds more than
    `max_tracked` triples (a flood of distinct targets cannot grow it without bound)."""

    def __init__(
        self,
        per_minute: int,
        *,
        max_tracked: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_minute = per_minute
        self._max_tracked = max_tracked
        self._monotonic = monotonic
        # triple -> [window start, rows written in it, refusals left out since the last row]
        self._windows: dict[tuple[str, str, int], list[float]] = {}

    def admit(self, call: AuditCall, status: int) -> int | None:
        """None: leave this refusal's row out. Otherwise the number of refusals left out before
        it (0 mostly), to name on its row."""
        now = self._monotonic()
        triple = (call.key_name, call.action, status)
        window = self._windows.get(triple)
        if window is None or now - window[0] >= 60.0:
            if window is None and len(self._windows) >= self._max_tracked:
                self._windows.clear()
            suppressed = int(window[2]) if window is not None else 0
            self._windows[triple] = [now, 1.0, 0.0]
            return suppressed
        if window[1] < self.per_minute:
            window[1] += 1
            suppressed, window[2] = int(window[2]), 0.0
            return suppressed
        window[2] += 1
        if window[2] == 1:
            get_logger().warning(
                "audit_refusals_suppressed", key_name=call.key_name, action=call.action,
                status=status, per_minute=self.per_minute,
            )  # fmt: skip
        return None


async def record_refusal(
    pool: AsyncConnectionPool[Conn],
    call: AuditCall,
    status: int,
    *,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
    throttle: RefusalThrottle | None = None,
) -> None:
    """Write the row of a refused call (`refused 401` / `refused 403`) in its own transaction,
    unless `throttle` leaves it out."""
    suppressed = throttle.admit(call, status) if throttle is not None else 0
    if suppressed is None:
        return
    if suppressed:
        detail = {**(detail or {}), "suppressed": suppressed}
    try:
        async with pool.connection() as conn, conn.transaction():
            await record(conn, call, f"refused {status}", detail=detail, now=now)
    except Exception as exc:  # the refusal stands; losing its row must not turn it into a 500
        get_logger().error(
            "audit_refusal_lost", action=call.action, status=status, error=type(exc).__name__
        )
