"""The dispatcher's task lifecycle: each public or internal call as one transaction. Claims live
in `claims`, completions in `completions`, bulk creation in `creation`; this class is the one
entry point the routes call.

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
import json
import random
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    ClaimBatchRequest,
    ClaimBatchResponse,
    ClaimedResponse,
    ClaimNextRequest,
    ClaimNextResponse,
    ClaimRequest,
    CompleteBatchRequest,
    CompleteBatchResponse,
    CompleteRequest,
    CompleteResponse,
    CreatedTask,
    CreateTaskRequest,
    CreateTasksRequest,
    CreateTasksResponse,
    EventsAcceptedResponse,
    EventsRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    NotClaimedItem,
    NotClaimedResponse,
    StepRequest,
    StepResponse,
    TaskList,
    TaskView,
)
from taskplat.common.errors import Conflict, NotFound, PinnedVersionNotCurrent, ValidationFailed
from taskplat.common.telemetry import inject
from taskplat.dispatcher import audit, pins
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.claim_waits import QueuedListener, Waiter
from taskplat.dispatcher.claims import Claims
from taskplat.dispatcher.completions import Completions
from taskplat.dispatcher.creation import BulkCreate, admit_untrusted, check_times, task_values
from taskplat.dispatcher.operations import QueueRegistry
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import tasks as repo
from taskplat.dispatcher.service_rules import (
    ListFilters,
    classify_rejection,
    decode_cursor,
    encode_cursor,
)
from taskplat.dispatcher.settings import DispatcherSettings
from taskplat.dispatcher.tokens import TokenIssuer
from taskplat.dispatcher.views import claim_task_payload, task_view


async def _write_task(
    conn: AsyncConnection[DictRow], params: dict[str, Any], claim: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
    """The insert alone (one statement, committed on return: the task, its wake-up and the
    NOTIFY), or with the `claim` for a waiting claim (both committed together, one round trip)."""
    if claim is None:
        return await repo.insert_task(conn, params), None
    return await repo.insert_task_and_claim_next(conn, params, claim)


class TaskService:
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
        claimed: list[dict[str, Any]] | None = None
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
                waiter.hand(claimed)
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
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
        """Insert the task, committed: its row (None: its idempotency key exists) and, for a
        taken `waiter`, the rows claimed for it in the same transaction."""
        loc: list[str | int] = ["body", "inputs"]
        claim = None
        if waiter is not None:
            claim = self._claims.claim_next_params(request.queue, waiter.worker_id, waiter.limit)
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

    # ---- internal worker API -------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> ClaimedResponse | NotClaimedResponse:
        return await self._claims.claim(request.task_id, request.worker_id)

    async def claim_batch(self, request: ClaimBatchRequest) -> ClaimBatchResponse:
        answers = await self._claims.claim_batch(request.task_ids, request.worker_id)
        return ClaimBatchResponse(
            claimed=[answer for answer in answers if isinstance(answer, ClaimedResponse)],
            not_claimed=[
                NotClaimedItem(
                    task_id=task_id,
                    reason=answer.reason,
                    detail=answer.detail,
                    retry_after_ms=answer.retry_after_ms,
                )
                for task_id, answer in zip(request.task_ids, answers, strict=True)
                if isinstance(answer, NotClaimedResponse)
            ],
        )

    async def claim_next(
        self, request: ClaimNextRequest, gone: asyncio.Future[object] | None = None
    ) -> ClaimNextResponse:
        """`gone` completes when the caller went away: a waiting claim then claims no more, and
        what it claimed as the caller went is handed back (its answer can no longer arrive)."""
        claimed = await self._claims.claim_next(
            request.queue,
            request.worker_id,
            request.max,
            wait_seconds=request.wait_seconds,
            gone=gone,
        )
        if claimed and gone is not None and gone.done():
            await self._hand_back(claimed)
            return ClaimNextResponse(claimed=[])
        refused = await self._claims.refused(
            request.queue, request.worker_id, request.max - len(claimed)
        )
        return ClaimNextResponse(claimed=claimed, not_claimed=refused)

    async def _hand_back(self, claimed: Sequence[ClaimedResponse]) -> None:
        """End the attempts a waiting claim took for a client that went away before its answer:
        failed `Drained` (not the task's fault, retried at once), as the stopping wrapper would
        have reported them."""
        await self._completions.complete_batch(
            [
                CompleteRequest(
                    task_id=answer.task.task_id,
                    attempt=answer.attempt,
                    lease_token=answer.lease_token,
                    status="Failed",
                    reason="Drained",
                    error_message="the waiting claim's client went away before its answer",
                )
                for answer in claimed
            ]
        )

    async def fetch(self, task_id: UUID) -> FetchResponse:
        async with self._pool.connection() as conn:
            row = await repo.fetch_task(conn, task_id)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return FetchResponse(
            status=row["status"], task=claim_task_payload(row, trust=self.tokens.trust(row))
        )

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        params = {
            "task_id": request.task_id,
            "attempt": request.attempt,
            "lease_token": request.lease_token,
            "lease_seconds": self._settings.lease_ttl_seconds,
            "now": self._clock.sql_now(),
        }
        async with self._pool.connection() as conn:
            row = await repo.heartbeat(conn, params)
            if row is None:
                # The guarded UPDATE judges the committed row: a claim committing right now (the
                # relay claims a Lambda attempt and invokes it in one open transaction) would be
                # missed. Before refusing, wait for the row lock and judge the latest row.
                async with conn.transaction():
                    fence = await repo.read_fence(conn, request.task_id, for_update=True)
                    if _holds_lease(fence, request):
                        row = await repo.heartbeat(conn, params)
            if row is not None:
                self._recorder.heartbeat(row)
                return HeartbeatResponse(lease_expires_at=row["lease_expires_at"])
        raise classify_rejection(fence, request.attempt, request.lease_token)

    async def events(self, request: EventsRequest) -> EventsAcceptedResponse:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                guarded, stored = await repo.insert_events_guarded(
                    conn,
                    task_id=request.task_id,
                    attempt=request.attempt,
                    lease_token=request.lease_token,
                    events=request.events,
                    now=self._clock.sql_now(),
                )
            if guarded:
                self._recorder.events_received(stored)
                return EventsAcceptedResponse(accepted=stored)
            fence = await repo.read_fence(conn, request.task_id)
        raise classify_rejection(fence, request.attempt, request.lease_token)

    async def step(self, request: StepRequest) -> StepResponse:
        """Look up or record a step's result of the current attempt's task; the first recorded
        result wins and is what every later call (of any attempt) gets back."""
        if request.records:
            size = len(json.dumps(request.result, separators=(",", ":")))
            if size > self._settings.result_max_bytes:
                raise ValidationFailed(
                    f"result is {size} bytes; the cap is {self._settings.result_max_bytes}",
                    detail=[{"loc": ["body", "result"], "msg": "result too large"}],
                )
        params = {
            "task_id": request.task_id,
            "attempt": request.attempt,
            "lease_token": request.lease_token,
            "step": request.step,
            "result": request.result,
            "record": request.records,
            "now": self._clock.sql_now(),
        }
        async with self._pool.connection() as conn:
            row = await repo.record_step(conn, params)
            if row["guarded"] and row["recorded_attempt"] is None and request.records:
                # A concurrent call of the same attempt stored it after this statement began.
                row = await repo.record_step(conn, {**params, "record": False})
            if row["guarded"]:
                if row["recorded_attempt"] is None:
                    return StepResponse(status="NotFound")
                status = "Recorded" if row["inserted"] else "Existing"
                return StepResponse(
                    status=status, result=row["result"], attempt=row["recorded_attempt"]
                )
            fence = await repo.read_fence(conn, request.task_id)
        raise classify_rejection(fence, request.attempt, request.lease_token)

    async def complete(self, request: CompleteRequest) -> CompleteResponse:
        return await self._completions.complete(request)

    async def complete_batch(self, request: CompleteBatchRequest) -> CompleteBatchResponse:
        """The completions, and the claim-next the request carries, in one transaction."""
        claim = request.claim_next
        if claim is None:
            results = await self._completions.complete_batch(list(request.completions))
            return CompleteBatchResponse(results=results)

        async def claim_next(conn: AsyncConnection[DictRow]) -> AsyncCursor[DictRow]:
            return await self._claims.start_claim_next_in(
                conn, claim.queue, claim.worker_id, claim.max
            )

        results, rows = await self._completions.complete_batch_and(
            list(request.completions), claim_next
        )
        claimed = await self._claims.claim_next_answer(None, claim.queue, claim.max, rows or [])
        # Untrusted tasks left for want of capability keys are counted (the answer has no place
        # for them: the wrapper's next claim-next names them).
        await self._claims.refused(claim.queue, claim.worker_id, claim.max - len(claimed))
        return CompleteBatchResponse(results=results, claimed=claimed)

    async def create_many(
        self, request: CreateTasksRequest, *, may_widen: bool = False
    ) -> CreateTasksResponse:
        created = await self._bulk.create_many(list(request.tasks), may_widen=may_widen)
        return CreateTasksResponse(
            results=[CreatedTask(created=flag, task=view) for view, flag in created]
        )


def _holds_lease(fence: dict[str, Any] | None, request: HeartbeatRequest) -> bool:
    return (
        fence is not None
        and fence["status"] == "Running"
        and fence["attempt"] == request.attempt
        and fence["lease_token"] == request.lease_token
    )
