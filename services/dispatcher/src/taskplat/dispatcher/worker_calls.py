"""The internal worker API of the dispatcher's task service: claims, fetch, heartbeats, events,
steps and completions (`/internal/...` routes). `TaskService` (service.py) inherits these calls
and sets the state they use; the invariants of service.py hold for each.

Invariants:
  * A worker call from anything but the holder of the current (attempt, lease token) changes
    nothing and is answered with the reason, classified from a read taken after the guarded
    statement failed. A refused heartbeat first waits for the task's row lock and judges the
    latest row, so it is never refused because the claim that granted its lease was still
    committing (a Lambda attempt's first call races the relay's commit).
  * What a waiting claim took for a client that went away before its answer is handed back
    (failed `Drained`, retried at once).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
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
    EventsAcceptedResponse,
    EventsRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    NotClaimedItem,
    NotClaimedResponse,
    StepRequest,
    StepResponse,
)
from taskplat.common.errors import NotFound, ValidationFailed
from taskplat.dispatcher.claims import Claims
from taskplat.dispatcher.completions import Completions
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import tasks as repo
from taskplat.dispatcher.service_rules import classify_rejection
from taskplat.dispatcher.settings import DispatcherSettings
from taskplat.dispatcher.tokens import TokenIssuer
from taskplat.dispatcher.views import claim_task_payload


class WorkerCalls:
    """The worker calls; the state below is set by `TaskService.__init__`."""

    _pool: AsyncConnectionPool[AsyncConnection[DictRow]]
    _clock: Clock
    _settings: DispatcherSettings
    _recorder: Recorder
    _claims: Claims
    _completions: Completions
    tokens: TokenIssuer

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
        claimed, refused = await self._claims.claim_next(
            request.queue,
            request.worker_id,
            request.max,
            wait_seconds=request.wait_seconds,
            gone=gone,
        )
        if claimed and gone is not None and gone.done():
            await self._hand_back(claimed)
            return ClaimNextResponse(claimed=[])
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

        statements = self._claims.claim_next_statements(claim.queue, claim.worker_id, claim.max)
        results, rows = await self._completions.complete_batch_and(
            list(request.completions), statements
        )
        claimed_rows = self._claims.claimed_rows(rows or [[]])
        # Untrusted tasks left for want of capability keys are counted (the answer has no place
        # for them: the wrapper's next claim-next names them).
        claimed, _ = await self._claims.claim_next_answer(
            None, claim.queue, claim.worker_id, claim.max, claimed_rows
        )
        return CompleteBatchResponse(results=results, claimed=claimed)


def _holds_lease(fence: dict[str, Any] | None, request: HeartbeatRequest) -> bool:
    return (
        fence is not None
        and fence["status"] == "Running"
        and fence["attempt"] == request.attempt
        and fence["lease_token"] == request.lease_token
    )
