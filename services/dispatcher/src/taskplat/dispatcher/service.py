"""The dispatcher's task lifecycle: each public or internal call as one transaction.

Invariants:
  * A state change commits together with its attempt record, outputs, events and outbox rows.
  * A worker call from anything but the holder of the current (attempt, lease token) changes nothing
    and is answered with the reason (`StaleAttempt`, `StaleLease`, `NotRunning`, `Canceled`,
    `NotFound`), classified from a read taken after the guarded statement failed.
  * A repeated accepted completion (same digest) is acknowledged and applies nothing again.
  * A late success of the current attempt after a timeout is accepted while no newer attempt started
    and the task was not canceled.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import random
from dataclasses import dataclass
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
from taskplat.dispatcher.repository import tasks as repo
from taskplat.dispatcher.settings import DispatcherSettings, OperatorDefaults
from taskplat.dispatcher.views import claim_task_payload, task_view

_NOT_CLAIMED_REASONS: dict[str, NotClaimedReason] = {
    "Running": "AlreadyRunning",
    "Completed": "Completed",
    "Canceled": "Canceled",
}


@dataclass(frozen=True)
class ListFilters:
    status: str | None
    queue: str | None
    operator: str | None
    cursor: str | None
    limit: int


def completion_digest(request: CompleteRequest) -> str:
    """A stable digest of a completion, to recognise an exact repeat."""
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode_cursor(created_at: datetime, task_id: UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(task_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at_text, task_id_text = json.loads(raw)
        created_at = datetime.fromisoformat(created_at_text)
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        return created_at, UUID(task_id_text)
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError) as exc:
        raise ValidationFailed(
            "invalid cursor", detail=[{"loc": ["query", "cursor"], "msg": "not a cursor"}]
        ) from exc


def classify_rejection(
    fence: dict[str, Any] | None, attempt: int, lease_token: UUID | None
) -> Rejected:
    """Why a guarded worker call did not match, from a fresh read of the task."""
    if fence is None:
        return Rejected("NotFound", "task not found")
    if fence["attempt"] != attempt:
        return Rejected("StaleAttempt", f"attempt {attempt} is not current ({fence['attempt']})")
    if lease_token is not None and fence["lease_token"] != lease_token:
        return Rejected("StaleLease", "lease token does not match the current lease")
    if fence["status"] == "Canceled":
        return Rejected("Canceled", "task was canceled")
    return Rejected("NotRunning", f"task is {fence['status']}, not Running")


class TaskService:
    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection[DictRow]],
        clock: Clock,
        settings: DispatcherSettings,
        rand: random.Random | None = None,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._settings = settings
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
                            conn, task_id=task_id, queue=row["queue"], now=now
                        )
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
                if not await repo.cancel_task(conn, task_id, now):
                    fence = await repo.read_fence(conn, task_id)
                    if fence is None:
                        raise NotFound(f"task {task_id} not found")
                    if fence["status"] != "Canceled":
                        raise Conflict(f"task is {fence['status']} and can no longer be canceled")
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
                await repo.enqueue_wakeup(conn, task_id=task_id, queue=row["queue"], now=now)
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
            row = await repo.claim_task(conn, params)
            if row is not None:
                return ClaimedResponse(
                    attempt=row["attempt"],
                    lease_token=row["lease_token"],
                    lease_expires_at=row["lease_expires_at"],
                    task=claim_task_payload(row),
                )
            fence = await repo.read_fence(conn, request.task_id)
        if fence is None:
            return NotClaimedResponse(reason="NotFound")
        return NotClaimedResponse(reason=_NOT_CLAIMED_REASONS.get(fence["status"], "NotQueued"))

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
                row = await repo.complete_running(conn, params)
                if row is not None:
                    await self._apply_completion(conn, row, request, digest, now)
                    return CompleteResponse(task_status=row["status"], repeated=False)
                fence = await repo.read_fence(conn, request.task_id, for_update=True)
                if (
                    fence is None
                    or fence["attempt"] != request.attempt
                    or (fence["lease_token"] != request.lease_token)
                ):
                    raise classify_rejection(fence, request.attempt, request.lease_token)
                if fence["completion_digest"] == digest:
                    return CompleteResponse(task_status=fence["status"], repeated=True)
                if fence["status"] == "Canceled":
                    if request.status == "Canceled":
                        return CompleteResponse(task_status="Canceled", repeated=False)
                    raise Rejected("Canceled", "task was canceled")
                if request.status == "Completed":
                    row = await repo.complete_late(conn, params)
                    if row is not None:
                        await self._apply_completion(conn, row, request, digest, now)
                        return CompleteResponse(task_status=row["status"], repeated=False)
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
                conn, task_id=request.task_id, queue=row["queue"], now=now
            )


def _first(*values: Any) -> Any:
    return next(value for value in values if value is not None)
