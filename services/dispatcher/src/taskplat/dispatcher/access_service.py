"""The calls of access and the fleet: API keys, the audit log, the workers, queue registration.

Invariants:
  * A new key's secret is made here, answered once and stored only as its sha256; creating or
    revoking a key, and registering a queue or setting its limits, writes its audit row in the same
    transaction; limits are written by the one SQL writer of them (`set_queue_limits`).
  * A worker's report is written at most once per `worker_report_seconds` per worker and
    replica (a wrapper sends one at most every few seconds anyway), so reports add no write per
    task; rows silent for longer than `worker_listed_seconds` are pruned (at most once a minute
    per replica). A worker is `lost` once silent for `worker_lost_seconds`.
  * The audit log is read newest first, paged by `audit_id`.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from taskplat.common.clock import Clock
from taskplat.common.contracts import QueueLimits, QueueView
from taskplat.common.contracts.access import (
    AuditEntry,
    AuditList,
    KeyCreated,
    KeyCreateRequest,
    KeyList,
    KeyView,
    RevokedKey,
    WorkerList,
    WorkerReport,
    WorkerView,
)
from taskplat.common.errors import Conflict, NotFound, ValidationFailed
from taskplat.common.logging import get_logger
from taskplat.dispatcher import audit
from taskplat.dispatcher.access import BOOTSTRAP, Identity, KeyStore, key_hash, new_secret
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.operations import Operations, QueueRegistry
from taskplat.dispatcher.repository import access as repo
from taskplat.dispatcher.repository import queues as queue_repo
from taskplat.dispatcher.settings import DispatcherSettings

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]
PRUNE_EVERY_SECONDS = 60.0
MAX_WORKERS_LISTED = 1000
_REPORTS_REMEMBERED = 10_000


class AccessService:
    def __init__(
        self,
        pool: Pool,
        clock: Clock,
        settings: DispatcherSettings,
        keys: KeyStore,
        registry: QueueRegistry,
        operations: Operations,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._settings = settings
        self._keys = keys
        self._registry = registry
        self._operations = operations
        self._reported: dict[str, float] = {}
        self._pruned_at = 0.0

    # ---- keys ----------------------------------------------------------------------------

    async def create_key(
        self, request: KeyCreateRequest, creator: Identity, call: AuditCall
    ) -> KeyCreated:
        if request.name.lower().startswith(BOOTSTRAP):
            raise ValidationFailed(
                f"key names starting with {BOOTSTRAP!r} are reserved for the bootstrap keys",
                detail=[{"loc": ["body", "name"], "msg": "reserved name", "type": "value"}],
            )
        secret = new_secret()
        scopes = sorted(set(request.scopes))
        now = self._clock.sql_now()
        async with self._pool.connection() as conn:
            async with conn.transaction():
                row = await repo.insert_key(
                    conn,
                    name=request.name,
                    key_hash=key_hash(secret),
                    scopes=scopes,
                    created_by=creator.name,
                    now=now,
                )
                if row is None:
                    raise Conflict(f"a key named {request.name!r} exists; revoke it first")
                await audit.record(
                    conn, call, "created", target=request.name, detail={"scopes": scopes}, now=now
                )
        get_logger().info("api_key_created", key=request.name, scopes=scopes)
        return KeyCreated(
            name=row["name"], scopes=row["scopes"], created_at=row["created_at"], key=secret
        )

    async def list_keys(self, call: AuditCall) -> KeyList:
        """The stored keys; an admin call, so it is audited too (who looked at the keys)."""
        async with self._pool.connection() as conn:
            async with conn.transaction():
                rows = await repo.list_keys(conn)
                await audit.record(conn, call, f"listed {len(rows)}", now=self._clock.sql_now())
        return KeyList(keys=[KeyView.model_validate(row) for row in rows])

    async def revoke_key(self, name: str, call: AuditCall) -> RevokedKey:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                if not await repo.delete_key(conn, name):
                    raise NotFound(f"no key named {name!r}")
                await audit.record(conn, call, "revoked", now=self._clock.sql_now())
        self._keys.forget(name)
        get_logger().info("api_key_revoked", key=name)
        return RevokedKey(name=name)

    # ---- audit log -----------------------------------------------------------------------

    async def audit_log(
        self,
        *,
        since: datetime | None,
        until: datetime | None,
        key: str | None,
        action: str | None,
        target: str | None,
        cursor: str | None,
        limit: int,
        call: AuditCall,
    ) -> AuditList:
        """A page of the audit log, newest first; an admin call, so it is audited too (who read
        the log), in the transaction that read the page."""
        before_id: int | None = None
        if cursor is not None:
            if not cursor.isdigit() or len(cursor) > 19:
                raise ValidationFailed(
                    "cursor is not a cursor this API returned",
                    detail=[
                        {"loc": ["query", "cursor"], "msg": "invalid cursor", "type": "cursor"}
                    ],
                )
            before_id = int(cursor)
        params: dict[str, Any] = {
            "since": since,
            "until": until,
            "key_name": key,
            "action": action,
            "target": target,
            "before_id": before_id,
            "limit": limit + 1,
        }
        async with self._pool.connection() as conn:
            async with conn.transaction():
                rows = await repo.list_audit(conn, params)
                await audit.record(
                    conn, call, f"listed {min(len(rows), limit)}", now=self._clock.sql_now()
                )
        page = rows[:limit]
        next_cursor = str(page[-1]["audit_id"]) if len(rows) > limit else None
        return AuditList(
            entries=[AuditEntry.model_validate(row) for row in page], next_cursor=next_cursor
        )

    # ---- workers -------------------------------------------------------------------------

    async def report(self, report: WorkerReport) -> None:
        """Store a wrapper's report of itself, at most once per `worker_report_seconds`."""
        now = time.monotonic()
        last = self._reported.get(report.worker_id)
        if last is not None and now - last < self._settings.worker_report_seconds:
            return
        if len(self._reported) >= _REPORTS_REMEMBERED:
            self._reported.clear()
        self._reported[report.worker_id] = now
        async with self._pool.connection() as conn:
            await repo.upsert_worker(
                conn,
                worker_id=report.worker_id,
                queues=report.queues,
                slots=report.slots,
                version=report.version,
                running=report.running,
                now=self._clock.sql_now(),
            )
            if now - self._pruned_at >= PRUNE_EVERY_SECONDS:
                self._pruned_at = now
                await repo.prune_workers(
                    conn,
                    older_than_seconds=self._settings.worker_listed_seconds,
                    now=self._clock.sql_now(),
                )

    async def workers(self) -> WorkerList:
        lost_after = self._settings.worker_lost_seconds
        async with self._pool.connection() as conn:
            rows = await repo.list_workers(
                conn,
                seen_within_seconds=self._settings.worker_listed_seconds,
                limit=MAX_WORKERS_LISTED,
                now=self._clock.sql_now(),
            )
        return WorkerList(
            workers=[
                WorkerView.model_validate(
                    {**row, "state": "lost" if row["seconds_since_seen"] >= lost_after else "alive"}
                )
                for row in rows
            ],
            lost_after_seconds=lost_after,
        )

    # ---- queues --------------------------------------------------------------------------

    async def register_queue(
        self, name: str, limits: QueueLimits | None, call: AuditCall
    ) -> tuple[QueueView, bool]:
        """Register `name` (persisted; every replica accepts it on its next miss); with `limits`,
        replace its limits too, in the same transaction as its audit row."""
        await self._registry.ensure_registered()
        now = self._clock.sql_now()
        async with self._pool.connection() as conn:
            async with conn.transaction():
                created = await repo.register_queue(conn, name, now)
                outcome = "registered" if created else "already registered"
                detail = None
                if limits is not None:
                    rate = limits.rate_limit
                    await queue_repo.set_queue_limits(
                        conn,
                        name,
                        concurrency_limit=limits.concurrency_limit,
                        key_concurrency_limit=limits.key_concurrency_limit,
                        rate_per_second=rate.per_second if rate else None,
                        rate_burst=rate.burst if rate else None,
                        now=now,
                    )
                    outcome = "registered, limits set" if created else "limits set"
                    detail = {"limits": limits.model_dump(mode="json")}
                await audit.record(conn, call, outcome, detail=detail, now=now)
        if created:
            get_logger().info("queue_registered", queue=name)
        if limits is not None:
            get_logger().info("queue_limits_set", queue=name, **limits.model_dump(mode="json"))
        for queue in (await self._operations.queues()).queues:
            if queue.name == name:
                return queue, created
        raise NotFound(f"queue {name!r} is not registered")  # pragma: no cover - raced away
