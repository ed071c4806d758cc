"""The dispatcher's task lifecycle: each public or internal call as one transaction.

Invariants:
  * A state change commits together with its attempt record, outputs, events and outbox rows.
  * A worker call from anything but the holder of the current (attempt, lease token) changes nothing
    and is answered with the reason (`StaleAttempt`, `StaleLease`, `NotRunning`, `Canceled`,
    `NotFound`), classified from a read taken after the guarded statement failed.
  * A repeated accepted completion (same digest) is acknowledged and applies nothing again.
  * A late success of the current attempt after a timeout is accepted while no newer attempt started
    and the task was not canceled.
  * A transition is recorded (metrics, one log event) only after its transaction committed; the
    outbox rows of POST /tasks, a replay and a completion that made the task Dead carry the current
    trace context (the request's server span), so the relay's send continues that trace.
"""

from __future__ import annotations

import json
import random
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    ClaimedResponse,
    ClaimRequest,
    CompleteRequest,
    CompleteResponse,
    EventsAcceptedResponse,
    EventsRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    NotClaimedReason,
    NotClaimedResponse,
    TaskList,
    TaskView,
)
from taskplat.common.contracts.public import CreateTaskRequest
from taskplat.common.errors import Conflict, NotFound, Rejected, ValidationFailed
from taskplat.common.telemetry import inject
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import tasks as repo
from taskplat.dispatcher.service_rules import (
    NOT_CLAIMED_REASONS,
    ListFilters,
    classify_rejection,
    completion_digest,
    decode_cursor,
    encode_cursor,
)
from taskplat.dispatcher.settings import DispatcherSettings, OperatorDefaults
from taskplat.dispatcher.views import claim_task_payload, task_view


class TaskService:
    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection[DictRow]],
        clock: Clock,
        settings: DispatcherSettings,
        recorder: Recorder,
        rand: random.Random | None = None,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._settings = settings
        self._recorder = recorder
        self._rand = rand or random.Random()

    # ---- public API ----------------------------------------------------------------------

    async def create(self, request: CreateTaskRequest) -> tuple[TaskView, bool]:
        """Create a task; (view, created). A known idempotency key returns the existing task."""
        if (
            request.scheduled_for is not None
            and request.expires_at is not None
            and request.expires_at <= request.scheduled_for
        ):
            raise ValidationFailed(
                "expires_at must be after scheduled_for",
                detail=[{"loc": ["body", "expires_at"], "msg": "must be after scheduled_for"}],
            )
        defaults = self._settings.operator_defaults.get(request.operator, OperatorDefaults())
        now = self._clock.sql_now()
        params = {
            "task_id": uuid4(),
            "queue": request.queue,
            "operator": request.operator,
            "job": Jsonb(request.job.model_dump()) if request.job else None,
            "config": Jsonb(request.config),
            "inputs": Jsonb(request.inputs),
            "max_attempts": _first(
                request.max_attempts, defaults.max_attempts, self._settings.default_max_attempts
            ),
            "backoff_base_seconds": _first(
                request.backoff_base_seconds,
                defaults.backoff_base_seconds,
                self._settings.default_backoff_base_seconds,
            ),
            "backoff_max_seconds": _first(
                request.backoff_max_seconds,
                defaults.backoff_max_seconds,
                self._settings.default_backoff_max_seconds,
            ),
            "timeout_seconds": request.timeout_seconds or defaults.timeout_seconds,
            "scheduled_for": request.scheduled_for,
            "expires_at": request.expires_at,
            "idempotency_key": request.idempotency_key,
            "now": now,
        }
        async with self._pool.connection() as conn:
            async with conn.transaction():
                row = await repo.insert_task(conn, params)
                if row is None:
                    assert request.idempotency_key is not None
                    existing = await repo.find_task_by_idempotency_key(
                        conn, request.idempotency_key
                    )
                    if existing is None:  # pragma: no cover - the conflicting row vanished
                        raise Conflict("idempotency key conflict, try again")
                    task_id, created = existing, False
                else:
                    task_id, created = row["task_id"], True
                    if row["status"] == "Queued":
                        await repo.enqueue_wakeup(
                            conn,
                            task_id=task_id,
                            queue=row["queue"],
                            now=now,
                            trace_context=inject(),
                        )
            if row is not None:  # committed
                self._recorder.task_created(row)
            view = await repo.get_task(conn, task_id)
        assert view is not None
        return task_view(view), created

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
            "after_created_at": after_created_at,
            "after_task_id": after_task_id,
            "limit": filters.limit + 1,
        }
        async with self._pool.connection() as conn:
            rows = await repo.list_tasks(conn, params)
        page = rows[: filters.limit]
        next_cursor = None
        if len(rows) > filters.limit:
            last = page[-1]
            next_cursor = encode_cursor(last["created_at"], last["task_id"])
        return TaskList(tasks=[task_view(row) for row in page], next_cursor=next_cursor)

    async def cancel(self, task_id: UUID) -> TaskView:
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
            if canceled is not None:
                self._recorder.task_canceled(canceled)
            row = await repo.get_task(conn, task_id)
        assert row is not None
        return task_view(row)

    async def replay(self, task_id: UUID) -> TaskView:
        now = self._clock.sql_now()
        async with self._pool.connection() as conn:
            async with conn.transaction():
                row = await repo.replay_task(conn, task_id, now)
                if row is None:
                    fence = await repo.read_fence(conn, task_id)
                    if fence is None:
                        raise NotFound(f"task {task_id} not found")
                    raise Conflict(
                        f"task is {fence['status']}; only Dead or Canceled tasks can be replayed"
                    )
                await repo.enqueue_wakeup(
                    conn, task_id=task_id, queue=row["queue"], now=now, trace_context=inject()
                )
            self._recorder.task_replayed(row)
            view = await repo.get_task(conn, task_id)
        assert view is not None
        return task_view(view)

    # ---- internal worker API -------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> ClaimedResponse | NotClaimedResponse:
        params = {
            "task_id": request.task_id,
            "worker_id": request.worker_id,
            "lease_token": uuid4(),
            "lease_seconds": self._settings.lease_ttl_seconds,
            "default_timeout_seconds": self._settings.default_timeout_seconds,
            "now": self._clock.sql_now(),
        }
        async with self._pool.connection() as conn:
            row = await repo.claim_task(conn, params)  # one statement: committed on return
            if row is not None:
                self._recorder.task_claimed(row)
                return ClaimedResponse(
                    attempt=row["attempt"],
                    lease_token=row["lease_token"],
                    lease_expires_at=row["lease_expires_at"],
                    task=claim_task_payload(row),
                )
            fence = await repo.read_fence(conn, request.task_id)
        reason: NotClaimedReason = (
            "NotFound" if fence is None else NOT_CLAIMED_REASONS.get(fence["status"], "NotQueued")
        )
        self._recorder.claim_not_claimed(request.task_id, request.worker_id, reason)
        return NotClaimedResponse(reason=reason)

    async def fetch(self, task_id: UUID) -> FetchResponse:
        async with self._pool.connection() as conn:
            row = await repo.fetch_task(conn, task_id)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return FetchResponse(status=row["status"], task=claim_task_payload(row))

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
            if row is not None:
                self._recorder.heartbeat(row)
                return HeartbeatResponse(lease_expires_at=row["lease_expires_at"])
            fence = await repo.read_fence(conn, request.task_id)
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
                return EventsAcceptedResponse(accepted=stored)
            fence = await repo.read_fence(conn, request.task_id)
        raise classify_rejection(fence, request.attempt, request.lease_token)

    async def complete(self, request: CompleteRequest) -> CompleteResponse:
        if request.result is not None:
            size = len(json.dumps(request.result, separators=(",", ":")))
            if size > self._settings.result_max_bytes:
                raise ValidationFailed(
                    f"result is {size} bytes; the cap is {self._settings.result_max_bytes}",
                    detail=[{"loc": ["body", "result"], "msg": "result too large"}],
                )
        digest = completion_digest(request)
        now = self._clock.sql_now()
        params = {
            "task_id": request.task_id,
            "attempt": request.attempt,
            "lease_token": request.lease_token,
            "status": request.status,
            "result": Jsonb(request.result) if request.result is not None else None,
            "error_message": request.error_message,
            "retry_after_seconds": request.retry_after_seconds,
            "jitter": self._rand.random(),
            "now": now,
        }
        async with self._pool.connection() as conn:
            async with conn.transaction():
                response, row, late = await self._complete_in(conn, request, params, digest, now)
        if row is not None:  # committed
            self._recorder.attempt_ended(row, request.status, late=late)
        return response

    async def _complete_in(
        self,
        conn: AsyncConnection[DictRow],
        request: CompleteRequest,
        params: dict[str, Any],
        digest: str,
        now: datetime | None,
    ) -> tuple[CompleteResponse, dict[str, Any] | None, bool]:
        """A completion inside the caller's transaction: the answer, the transitioned row (None
        when nothing changed) and whether it was a late success; raises `Rejected` when stale."""
        row = await repo.complete_running(conn, params)
        if row is not None:
            await self._apply_completion(conn, row, request, digest, now)
            return CompleteResponse(task_status=row["status"], repeated=False), row, False
        fence = await repo.read_fence(conn, request.task_id, for_update=True)
        if (
            fence is None
            or fence["attempt"] != request.attempt
            or (fence["lease_token"] != request.lease_token)
        ):
            raise classify_rejection(fence, request.attempt, request.lease_token)
        if fence["completion_digest"] == digest:
            return CompleteResponse(task_status=fence["status"], repeated=True), None, False
        if fence["status"] == "Canceled":
            if request.status == "Canceled":
                return CompleteResponse(task_status="Canceled", repeated=False), None, False
            raise Rejected("Canceled", "task was canceled")
        if request.status == "Completed":
            row = await repo.complete_late(conn, params)
            if row is not None:
                await self._apply_completion(conn, row, request, digest, now)
                return CompleteResponse(task_status=row["status"], repeated=False), row, True
        raise classify_rejection(fence, request.attempt, request.lease_token)

    async def _apply_completion(
        self,
        conn: AsyncConnection[DictRow],
        row: dict[str, Any],
        request: CompleteRequest,
        digest: str,
        now: datetime | None,
    ) -> None:
        """Commit what an accepted completion carries, in the transition's transaction."""
        await repo.close_attempt(
            conn,
            {
                "task_id": request.task_id,
                "attempt": request.attempt,
                "lease_token": request.lease_token,
                "outcome": request.status,
                "error": request.error_message if request.status == "Failed" else None,
                "completion_digest": digest,
                "now": now,
            },
        )
        await repo.store_events(
            conn, task_id=request.task_id, attempt=request.attempt, events=request.events, now=now
        )
        if request.status == "Completed":
            await repo.store_outputs(
                conn,
                task_id=request.task_id,
                attempt=request.attempt,
                outputs=request.outputs,
                now=now,
            )
        if row["status"] == "Dead":
            await repo.enqueue_dead_letter(
                conn, task_id=request.task_id, queue=row["queue"], now=now, trace_context=inject()
            )


def _first(*values: Any) -> Any:
    return next(value for value in values if value is not None)
