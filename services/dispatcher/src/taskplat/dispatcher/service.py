"""The dispatcher's task lifecycle: each public or internal call as one transaction. Claims live
in `claims`, completions in `completions`, bulk creation in `creation`, the internal worker calls
in `worker_calls` (inherited); this class is the one entry point the routes call.

Invariants:
  * A state change commits together with its attempt record, outputs, events and outbox rows.
  * A worker call from anything but the holder of the current (attempt, lease token) changes nothing
    and is answered with the reason (`StaleAttempt`, `StaleLease`, `NotRunning`, `Canceled`,
    `NotFound`), classified from a read taken after the guarded statement failed. A refused
    heartbeat first waits for the task's row lock and judges the latest row, so it is never
    refused because the claim that granted its lease was still committing (a Lambda attempt's
    first call races the relay's commit).
  * A repeated accepted completion (same digest) is acknowledged and applies nothing again.
  * A late success of the current attempt after a timeout is accepted while no newer attempt started
    and the task was not canceled.
  * A transition is recorded (metrics, one log event) only after its transaction committed; the
    outbox rows of POST /tasks, a replay and a completion that made the task Dead carry the current
    trace context (the request's server span), so the relay's send continues that trace.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    CreatedTask,
    CreateTaskRequest,
    CreateTasksRequest,
    CreateTasksResponse,
    TaskList,
    TaskView,
)
from taskplat.common.db.round_trip import Statement
from taskplat.common.errors import Conflict, NotFound, PinnedVersionNotCurrent
from taskplat.common.telemetry import inject
from taskplat.dispatcher import audit, pins
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.claim_waits import QueuedListener, Waiter
from taskplat.dispatcher.claims import ClaimedRows, Claims
from taskplat.dispatcher.completions import Completions
from taskplat.dispatcher.creation import BulkCreate, admit_untrusted, check_times, task_values
from taskplat.dispatcher.operations import QueueRegistry
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import tasks as repo
from taskplat.dispatcher.service_rules import (
    ListFilters,
    decode_cursor,
    encode_cursor,
)
from taskplat.dispatcher.settings import DispatcherSettings
from taskplat.dispatcher.tokens import TokenIssuer
from taskplat.dispatcher.views import task_view
from taskplat.dispatcher.worker_calls import WorkerCalls


async def _write_task(
    conn: AsyncConnection[DictRow], params: dict[str, Any], claim: list[Statement] | None
) -> tuple[dict[str, Any] | None, ClaimedRows | None]:
    """The insert alone (one statement, committed on return: the task, its wake-up and the
    NOTIFY), or with the `claim` for a waiting claim (committed together, one round trip)."""
    if claim is None:
        return await repo.insert_task(conn, params), None
    row, results = await repo.insert_task_and(conn, params, claim)
    return row, Claims.claimed_rows(results)


class TaskService(WorkerCalls):
    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection[DictRow]],
        clock: Clock,
        settings: DispatcherSettings,
        recorder: Recorder,
        rand: random.Random | None = None,
        *,
        registry: QueueRegistry,
        listener: QueuedListener | None = None,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._settings = settings
        self._recorder = recorder
        self._rand = rand or random.Random()
        self.tokens = TokenIssuer(settings, clock)
        self._claims = Claims(pool, clock, settings, recorder, self.tokens, listener)
        self._completions = Completions(pool, clock, settings, recorder, self._rand)
        self._registry = registry
        self._listener = listener
        self._bulk = BulkCreate(pool, clock, settings, recorder, registry)

    # ---- public API ----------------------------------------------------------------------

    async def create(
        self, request: CreateTaskRequest, *, may_widen: bool = False
    ) -> tuple[TaskView, bool]:
        """Create a task; (view, created). A known idempotency key returns the existing task.
        `may_widen`: the caller may pin an untrusted task outside its job's inputs (`operate`)."""
        check_times(request, ["body"])
        await self._registry.require([request.queue], ["body"])
        now = self._clock.sql_now()
        # One of this dispatcher's waiting claims of the queue waits: claim for it in this
        # transaction rather than wake it through a NOTIFY; one still in its first claim is
        # woken after the commit instead (see `claim_waits`).
        listener = self._listener
        waiter = listener.take(request.queue) if listener is not None else None
        wake_here = waiter is None and listener is not None and listener.waits_here(request.queue)
        claimed: ClaimedRows | None = None
        params = {
            **repo.new_task_params([task_values(request, self._settings)]),
            "now": now,
            "trace_context": repo.wakeup_trace_context(inject()),
            "polled_wakeup_delay_seconds": self._settings.polled_wakeup_delay_seconds,
            "notify_held": waiter is None and not wake_here,
        }
        try:
            async with self._pool.connection() as conn:
                await admit_untrusted(
                    conn, self._settings, [request], ["body"], may_widen=may_widen, batch=False
                )
                row, claimed = await self._insert(conn, request, params, waiter)
                if row is None:
                    assert request.idempotency_key is not None
                    existing = await repo.get_task_by_idempotency_key(conn, request.idempotency_key)
                    if existing is None:  # pragma: no cover - the conflicting row vanished
                        raise Conflict("idempotency key conflict, try again")
                    return task_view(existing), False
        finally:
            if waiter is not None:  # what it claimed for the waiting claim, else a plain wake
                waiter.hand(claimed if claimed is not None and claimed.rows else None)
        if wake_here and row["held"]:  # its held wake-up NOTIFYd no one
            assert listener is not None
            listener.wake(request.queue)
        if waiter is not None or wake_here:
            # One turn: the waiting claim's answer goes out before this create is recorded and
            # answered.
            await asyncio.sleep(0)
        # Committed: the statement's row is the new task as it was created (no read back).
        self._recorder.task_created(row)
        return task_view(row), True

    async def _insert(
        self,
        conn: AsyncConnection[DictRow],
        request: CreateTaskRequest,
        params: dict[str, Any],
        waiter: Waiter | None,
    ) -> tuple[dict[str, Any] | None, ClaimedRows | None]:
        """Insert the task, committed: its row (None: its idempotency key exists) and, for a
        taken `waiter`, what was claimed for it in the same transaction."""
        loc: list[str | int] = ["body", "inputs"]
        claim = None
        if waiter is not None:
            claim = self._claims.claim_next_statements(
                request.queue, waiter.worker_id, waiter.limit
            )
        if not (request.job is not None and pins.dataset_reads(request.inputs, loc)):
            return await _write_task(conn, params, claim)
        # The datasets stay share-locked until the task and its pins commit.
        async with conn.transaction():
            params["inputs"] = [Jsonb(await pins.pin_inputs(conn, request.inputs, loc))]
            return await _write_task(conn, params, claim)

    async def get(self, task_id: UUID) -> TaskView:
        async with self._pool.connection() as conn:
            row = await repo.get_task(conn, task_id)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return task_view(row)

    async def list(self, filters: ListFilters) -> TaskList:
        after_created_at, after_task_id = (
            decode_cursor(filters.cursor) if filters.cursor else (None, None)
        )
        params = {
            "status": filters.status,
            "queue": filters.queue,
            "operator": filters.operator,
            "dag": filters.dag,
            "job": filters.job,
            "since": filters.since,
            "until": filters.until,
            "after_created_at": after_created_at,
            "after_task_id": after_task_id,
            "limit": filters.limit + 1,
        }
        async with self._pool.connection() as conn:
            if filters.idempotency_key is not None:  # the one task of the key (unique index)
                row = await repo.get_task_by_idempotency_key(conn, filters.idempotency_key)
                return TaskList(tasks=[task_view(row)] if row is not None else [], next_cursor=None)
            rows = await repo.list_tasks(conn, params)
        page = rows[: filters.limit]
        next_cursor = None
        if len(rows) > filters.limit:
            last = page[-1]
            next_cursor = encode_cursor(last["created_at"], last["task_id"])
        return TaskList(tasks=[task_view(row) for row in page], next_cursor=next_cursor)

    async def cancel(self, task_id: UUID, call: AuditCall) -> TaskView:
        now = self._clock.sql_now()
        async with self._pool.connection() as conn:
            async with conn.transaction():
                canceled = await repo.cancel_task(conn, task_id, now)
                if canceled is None:
                    fence = await repo.read_fence(conn, task_id)
                    if fence is None:
                        raise NotFound(f"task {task_id} not found")
                    if fence["status"] != "Canceled":
                        raise Conflict(f"task is {fence['status']} and can no longer be canceled")
                await audit.record(
                    conn, call, "canceled" if canceled is not None else "already canceled", now=now
                )
            if canceled is not None:
                self._recorder.task_canceled(canceled)
            row = await repo.get_task(conn, task_id)
        assert row is not None
        return task_view(row)

    async def replay(self, task_id: UUID, call: AuditCall, *, repin: bool = False) -> TaskView:
        """Replay a Dead or Canceled task; one pinned to a dataset version that is no longer
        current is refused (PinnedVersionNotCurrent) unless `repin` moves it to the current
        versions first."""
        now = self._clock.sql_now()
        async with self._pool.connection() as conn:
            async with conn.transaction():
                if await repo.replay_pins(conn, [task_id], repin=repin):
                    raise PinnedVersionNotCurrent(
                        f"task {task_id} is pinned to a dataset version that is no longer "
                        'current; replay it with "repin": true to move it to the current '
                        "versions",
                        detail={"reason": "PinnedVersionNotCurrent"},
                    )
                row = await repo.replay_task(conn, task_id, now, inject())
                if row is None:
                    fence = await repo.read_fence(conn, task_id)
                    if fence is None:
                        raise NotFound(f"task {task_id} not found")
                    raise Conflict(
                        f"task is {fence['status']}; only Dead or Canceled tasks can be replayed"
                    )
                await repo.notify_outbox(conn, row["queue"])
                await audit.record(conn, call, "replayed", now=now)
            self._recorder.task_replayed(row)
            view = await repo.get_task(conn, task_id)
        assert view is not None
        return task_view(view)

    async def create_many(
        self, request: CreateTasksRequest, *, may_widen: bool = False
    ) -> CreateTasksResponse:
        created = await self._bulk.create_many(list(request.tasks), may_widen=may_widen)
        return CreateTasksResponse(
            results=[CreatedTask(created=flag, task=view) for view, flag in created]
        )
