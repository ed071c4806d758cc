"""The operators' calls: the queue registry (list, pause, resume), bulk replay and the
dashboard's figures.

Invariants:
  * The registry holds every queue a task may name: the dispatcher registers its `queues` setting
    at start-up (or on first use, when Postgres was down then: the app still starts);
    `QueueRegistry.require` answers 422 naming the known queues for any other. Known names are
    cached in the process and the registry is read again on a miss, so a queue registered by
    another replica or by the deployment is accepted without a restart.
  * Pausing or resuming an unknown queue answers 404; pausing a paused queue (or resuming a running
    one) changes nothing and answers the queue. A resume re-announces the queue's Queued tasks in
    its transaction, since their wake-ups were answered `Paused` while it was paused.
  * A bulk replay is one transaction: each task it names or selects that is Dead or Canceled is
    Queued again as a new attempt with a fresh budget, with its outbox row; ids that are unknown
    or not replayable are listed as skipped, and so is every picked task pinned to a dataset
    version that is no longer current (`PinnedVersionNotCurrent`) unless the request says
    `repin` (then it is re-pinned to the current versions and replayed). Metrics and log events
    follow the commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any
from uuid import UUID

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    BulkRetryRequest,
    BulkRetryResponse,
    BulkRetrySkipped,
    QueueLimits,
    QueueLimitsUse,
    QueueList,
    QueueView,
    RateLimit,
    StateCount,
    Stats,
    ThroughputBucket,
)
from taskplat.common.errors import NotFound, ValidationFailed
from taskplat.common.logging import get_logger
from taskplat.common.telemetry import inject
from taskplat.dispatcher import audit
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import queues as repo
from taskplat.dispatcher.repository import tasks as task_repo

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]
DEFAULT_REPLAY_LIMIT = 100
RESUME_ANNOUNCE_LIMIT = 10_000
STARTUP_TIMEOUT_SECONDS = 2.0


def queue_view(row: dict[str, Any]) -> QueueView:
    """A `list_queues` row as its view: the limits, and their use where a limit is set."""
    counted = row["concurrency_limit"] is not None or row["key_concurrency_limit"] is not None
    rate = (
        RateLimit(per_second=row["rate_per_second"], burst=row["rate_burst"])
        if row["rate_per_second"] is not None
        else None
    )
    limits = QueueLimits(
        concurrency_limit=row["concurrency_limit"],
        key_concurrency_limit=row["key_concurrency_limit"],
        rate_limit=rate,
    )
    use = QueueLimitsUse(
        running=row["limits_running"] if counted else None,
        keys_at_limit=row["keys_at_limit"] if row["key_concurrency_limit"] is not None else None,
        tokens_left=row["tokens_left"] if rate is not None else None,
    )
    fields = {name: row[name] for name in QueueView.model_fields if name in row}
    return QueueView.model_validate({**fields, "limits": limits, "limits_use": use})


class QueueRegistry:
    """The names of the registered queues, cached; re-read from Postgres on a miss. The queues of
    the `queues` setting are registered at start-up, or on first use when Postgres was down."""

    def __init__(self, pool: Pool, clock: Clock, names: Iterable[str]) -> None:
        self._pool = pool
        self._clock = clock
        self._names = sorted(set(names))
        self._known: frozenset[str] = frozenset()
        self._registered = False
        self._lock = asyncio.Lock()

    async def ensure_registered(self, timeout: float | None = None) -> None:
        if self._registered:
            return
        async with self._lock:
            if self._registered:
                return
            async with self._pool.connection(timeout=timeout) as conn:
                await repo.register_queues(conn, self._names, self._clock.sql_now())
                self._known = frozenset(await repo.known_queues(conn))
            self._registered = True
            get_logger().info("queues_registered", queues=self._names)

    async def try_register(self) -> None:
        """At start-up: register now if Postgres answers, else on first use."""
        try:
            await self.ensure_registered(timeout=STARTUP_TIMEOUT_SECONDS)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            get_logger().warning("queues_not_registered_yet", error=type(exc).__name__)

    async def require(self, names: Iterable[str], loc: list[str | int]) -> None:
        wanted = set(names)
        if self._registered and wanted <= self._known:
            return
        await self.ensure_registered()
        async with self._pool.connection() as conn:
            self._known = frozenset(await repo.known_queues(conn))
        unknown = sorted(wanted - self._known)
        if unknown:
            known = ", ".join(sorted(self._known)) or "none"
            raise ValidationFailed(
                f"unknown queue {', '.join(map(repr, unknown))}; known queues: {known}",
                detail=[
                    {"loc": [*loc, "queue"], "msg": "unknown queue", "input": name}
                    for name in unknown
                ],
            )


class Operations:
    def __init__(
        self, pool: Pool, clock: Clock, recorder: Recorder, registry: QueueRegistry
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._recorder = recorder
        self._registry = registry

    async def queues(self) -> QueueList:
        await self._registry.ensure_registered()
        async with self._pool.connection() as conn:
            rows = await repo.list_queues(conn, self._clock.sql_now())
        return QueueList(queues=[queue_view(row) for row in rows])

    async def view(self, name: str) -> QueueView:
        for queue in (await self.queues()).queues:
            if queue.name == name:
                return queue
        raise NotFound(f"queue {name!r} is not registered")

    async def pause(self, name: str, call: AuditCall) -> QueueView:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                changed = await repo.set_paused(conn, name, self._clock.sql_now())
                if changed is not None:
                    outcome = "paused" if changed else "already paused"
                    await audit.record(conn, call, outcome, now=self._clock.sql_now())
        if changed is None:
            raise NotFound(f"queue {name!r} is not registered")
        if changed:
            self._recorder.queue_paused(name)
        return await self.view(name)

    async def resume(self, name: str, call: AuditCall) -> QueueView:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                if not await repo.queue_exists(conn, name):
                    raise NotFound(f"queue {name!r} is not registered")
                resumed, announced = await repo.resume(
                    conn, name, self._clock.sql_now(), RESUME_ANNOUNCE_LIMIT
                )
                if announced:
                    await repo.notify_queues(conn, [name])
                outcome = f"resumed, {announced} announced" if resumed else "already running"
                await audit.record(conn, call, outcome, now=self._clock.sql_now())
        if resumed:
            self._recorder.queue_resumed(name, announced)
        return await self.view(name)

    async def replay_many(self, request: BulkRetryRequest, call: AuditCall) -> BulkRetryResponse:
        filters = request.model_dump(exclude={"ids", "limit"}, exclude_none=True)
        if request.ids is None and "status" not in filters:
            filters["status"] = "Dead"
        ids = list(dict.fromkeys(request.ids)) if request.ids is not None else None
        limit = len(ids) if ids is not None else (request.limit or DEFAULT_REPLAY_LIMIT)
        async with self._pool.connection() as conn:
            async with conn.transaction():
                picked = await repo.pick_replayable(conn, ids=ids, filters=filters, limit=limit)
                stale = set(await task_repo.replay_pins(conn, picked, repin=request.repin))
                rows = await repo.replay_tasks(
                    conn,
                    [task_id for task_id in picked if task_id not in stale],
                    now=self._clock.sql_now(),
                    trace_context=inject(),
                )
                if rows:
                    await repo.notify_queues(conn, sorted({row["queue"] for row in rows}))
                await audit.record(
                    conn,
                    call,
                    f"replayed {len(rows)}",
                    detail={"ids": [str(i) for i in ids]} if ids is not None else filters,
                    now=self._clock.sql_now(),
                )
            replayed = [row["task_id"] for row in rows]
            skipped = [
                BulkRetrySkipped(task_id=task_id, reason="PinnedVersionNotCurrent")
                for task_id in picked
                if task_id in stale
            ]
            if ids is not None:
                missing = [task_id for task_id in ids if task_id not in set(picked)]
                existing = await repo.existing_tasks(conn, missing) if missing else set[UUID]()
                skipped += [
                    BulkRetrySkipped(
                        task_id=task_id,
                        reason="NotReplayable" if task_id in existing else "NotFound",
                    )
                    for task_id in missing
                ]
        for row in rows:
            self._recorder.task_replayed(row)
        self._recorder.bulk_replay(len(rows), by="ids" if ids is not None else "filter")
        return BulkRetryResponse(replayed=replayed, skipped=skipped)

    async def stats(self) -> Stats:
        now = self._clock.sql_now()
        async with self._pool.connection() as conn:
            counts = await repo.state_counts(conn, now)
            buckets = await repo.throughput(conn, now)
            generated_at = self._clock.now()
        return Stats(
            generated_at=generated_at,
            counts=[StateCount.model_validate(row) for row in counts],
            throughput=[ThroughputBucket.model_validate(row) for row in buckets],
        )
