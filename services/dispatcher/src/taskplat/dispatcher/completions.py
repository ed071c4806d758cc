"""Completions of worker attempts: `task-complete` and `task-complete-batch`.

Invariants:
  * The holder of the current (attempt, lease token) completes with one statement
    (`complete_running`): the transition, the attempt record, events, outputs and a dead-letter
    outbox row commit together, and nothing is written unless the guard matched.
  * When the guard did not match, the completion is settled in a transaction that locks the task
    row: an exact repeat (same digest) is acknowledged; a late success of the current attempt
    after a timeout is accepted while no newer attempt started and the task was not canceled;
    anything else is refused with the reason, classified from that locked read.
  * A batch is one transaction with its completions in task_id order (the lock order of every
    batch statement), each its own guarded transition with the answer (HTTP status and body) the
    single route would give it: the first completion of each task in one `complete_many`
    statement, the others (guard not matched, or a task named again) settled one by one after.
    A refused completion writes nothing, so it cannot undo another's acceptance; when a
    completion cannot be stored at all (a value Postgres refuses, a deadlock), the transaction
    is rolled back and every completion of the batch is retried on its own.
  * A batch may carry more statements (`also`, the claim-next of a combined call) that run in
    the batch's transaction after its completions: the completions and it commit together or
    not at all, and its rows are read only with the COMMIT's answer. When the batch is retried
    completion by completion, `also` runs after them in a transaction of its own; a batch that
    fails otherwise fails the whole call, having claimed nothing.
  * The batch's transaction is pipelined (`pipelined_transaction`): BEGIN goes to Postgres with
    the completions, COMMIT with `also`; a batch whose completions all matched their guard is
    two round trips.
  * A transition is recorded (metrics, one log event) only after its transaction committed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
import structlog
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    CompleteBatchResult,
    CompleteRequest,
    CompleteResponse,
    ErrorResponse,
    RejectedResponse,
)
from taskplat.common.db.round_trip import Statement, pipelined_transaction, rows_of, send
from taskplat.common.errors import Rejected, ValidationFailed
from taskplat.common.telemetry import inject
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import batch
from taskplat.dispatcher.repository import tasks as repo
from taskplat.dispatcher.service_rules import classify_rejection, completion_digest
from taskplat.dispatcher.settings import DispatcherSettings

BATCH_ROUTE = "/internal/task-complete-batch"
Conn = AsyncConnection[DictRow]
Row = dict[str, Any]
# Errors after which a batch is retried completion by completion (nothing of it committed).
_RETRY_ALONE = (psycopg.DataError, psycopg.errors.DeadlockDetected)


@dataclass(frozen=True)
class _Prepared:
    index: int
    request: CompleteRequest
    digest: str
    params: dict[str, Any]


@dataclass(frozen=True)
class _Settled:
    response: CompleteResponse
    row: Row | None  # the transitioned row; None when nothing changed
    late: bool


def _accepted(row: Row, *, late: bool = False) -> _Settled:
    return _Settled(CompleteResponse(task_status=row["status"], repeated=False), row, late)


def _acknowledged(task_status: str, *, repeated: bool) -> _Settled:
    response = CompleteResponse(task_status=task_status, repeated=repeated)
    return _Settled(response, None, late=False)


class Completions:
    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        clock: Clock,
        settings: DispatcherSettings,
        recorder: Recorder,
        rand: random.Random,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._settings = settings
        self._recorder = recorder
        self._rand = rand

    async def complete(self, request: CompleteRequest) -> CompleteResponse:
        """One completion; raises `Rejected` (stale) or `ValidationFailed` (result too large)."""
        prepared = self._prepare(0, request)
        async with self._pool.connection() as conn:
            row = None
            if request.status != "Canceled":  # only a canceled task's holder may report Canceled
                row = await repo.complete_running(conn, prepared.params)  # committed on return
            if row is not None:
                settled = _accepted(row)
            else:
                async with conn.transaction():
                    settled = await self._settle(conn, prepared)
        self._record(request, settled)
        return settled.response

    async def complete_batch(self, requests: list[CompleteRequest]) -> list[CompleteBatchResult]:
        results, _ = await self.complete_batch_and(requests, None)
        return results

    async def complete_batch_and(
        self, requests: list[CompleteRequest], also: Sequence[Statement] | None
    ) -> tuple[list[CompleteBatchResult], list[list[Row]] | None]:
        """The batch, then the statements `also` in the same transaction; each completion's
        result and the rows of each of `also`'s statements (None without it)."""
        results: dict[int, CompleteBatchResult] = {}
        pending: list[_Prepared] = []
        for index, request in enumerate(requests):
            try:
                pending.append(self._prepare(index, request))
            except ValidationFailed as exc:
                results[index] = _error_result(request, exc)
        pending.sort(key=lambda item: (item.request.task_id, item.index))
        settled: list[tuple[_Prepared, _Settled]] = []
        extra: list[list[Row]] | None = None
        try:
            async with self._pool.connection() as conn:
                also_sent = None
                async with pipelined_transaction(conn):
                    for item, outcome in await self._complete_all_in(conn, pending):
                        if isinstance(outcome, Rejected):
                            results[item.index] = self._rejected_result(item.request, outcome)
                        else:
                            settled.append((item, outcome))
                            results[item.index] = _ok_result(item.request, outcome.response)
                    if also is not None:
                        also_sent = await send(conn, also)
                if also_sent is not None:  # read with the COMMIT's answer: committed
                    extra = await rows_of(also_sent)
        except _RETRY_ALONE:
            settled.clear()
            for item in pending:
                results[item.index] = await self._complete_alone(item.request)
            if also is not None:
                async with self._pool.connection() as conn, conn.transaction():
                    extra = await rows_of(await send(conn, also))
        self._record_all(settled)  # committed
        return [results[index] for index in range(len(requests))], extra

    # ---- internals ----------------------------------------------------------------------

    def _prepare(self, index: int, request: CompleteRequest) -> _Prepared:
        if request.result is not None:
            size = len(json.dumps(request.result, separators=(",", ":")))
            if size > self._settings.result_max_bytes:
                raise ValidationFailed(
                    f"result is {size} bytes; the cap is {self._settings.result_max_bytes}",
                    detail=[{"loc": ["body", "result"], "msg": "result too large"}],
                )
        digest = completion_digest(request)
        params = repo.completion_params(
            request,
            digest=digest,
            jitter=self._rand.random(),
            now=self._clock.sql_now(),
            trace_context=inject(),
        )
        return _Prepared(index, request, digest, params)

    async def _complete_alone(self, request: CompleteRequest) -> CompleteBatchResult:
        """One completion of a batch in its own transactions, as the single route does it."""
        try:
            return _ok_result(request, await self.complete(request))
        except Rejected as exc:
            return self._rejected_result(request, exc)
        except ValidationFailed as exc:
            return _error_result(request, exc)
        except psycopg.DataError as exc:
            first_line = (str(exc).splitlines() or ["invalid value"])[0]
            body = ErrorResponse(
                error="validation_error", message=f"a value cannot be stored: {first_line}"
            )
            return CompleteBatchResult(task_id=request.task_id, status_code=422, body=body)

    async def _complete_all_in(
        self, conn: Conn, pending: list[_Prepared]
    ) -> list[tuple[_Prepared, _Settled | Rejected]]:
        """The completions of a batch (in task_id order) inside the caller's transaction: the
        first completion of each task in one `complete_many` statement, then, one by one, those
        whose guard did not match and any later completion of a task already named."""
        firsts: dict[UUID, _Prepared] = {}
        for item in pending:
            if item.request.status != "Canceled":  # settled alone: Canceled never transitions
                firsts.setdefault(item.request.task_id, item)
        rows: dict[UUID, Row] = {}
        if firsts:
            params = _many_params(list(firsts.values()), self._clock.sql_now())
            rows = {row["task_id"]: row for row in await batch.complete_many(conn, params)}
        for row in rows.values():
            if row["status"] == "Dead":
                await repo.enqueue_dead_letter(
                    conn,
                    task_id=row["task_id"],
                    queue=row["queue"],
                    now=firsts[row["task_id"]].params["now"],
                    trace_context=inject(),
                )
        outcomes: list[tuple[_Prepared, _Settled | Rejected]] = []
        for item in pending:
            done = rows.get(item.request.task_id)
            if done is not None and firsts.get(item.request.task_id) is item:
                outcomes.append((item, _accepted(done)))
                continue
            try:
                outcomes.append((item, await self._settle(conn, item)))
            except Rejected as exc:
                outcomes.append((item, exc))
        return outcomes

    async def _settle(self, conn: Conn, item: _Prepared) -> _Settled:
        """A completion whose guard did not match, inside the caller's transaction."""
        request, params = item.request, item.params
        fence = await repo.read_fence(conn, request.task_id, for_update=True)
        if (
            fence is None
            or fence["attempt"] != request.attempt
            or (fence["lease_token"] != request.lease_token)
        ):
            raise classify_rejection(fence, request.attempt, request.lease_token)
        if fence["completion_digest"] == item.digest:
            return _acknowledged(fence["status"], repeated=True)
        if fence["status"] == "Canceled":
            if request.status == "Canceled":
                return _acknowledged("Canceled", repeated=False)
            raise Rejected("Canceled", "task was canceled")
        if request.status == "Canceled" and fence["status"] == "Running":
            raise Rejected("NotCanceled", "task is Running: nobody canceled it")
        if request.status == "Completed":
            row = await repo.complete_late(conn, params)
            if row is not None:
                return _accepted(row, late=True)
        raise classify_rejection(fence, request.attempt, request.lease_token)

    def _record(self, request: CompleteRequest, settled: _Settled) -> None:
        if settled.row is not None:
            self._recorder.attempt_ended(settled.row, request.ended, late=settled.late)
            self._recorder.events_received(len(request.events))

    def _record_all(self, settled: list[tuple[_Prepared, _Settled]]) -> None:
        """`_record` for each settled completion of a batch, their lines written together."""
        accepted = [
            (item.request, outcome.row, outcome.late)
            for item, outcome in settled
            if outcome.row is not None
        ]
        self._recorder.attempts_ended(
            [(row, request.ended, late) for request, row, late in accepted]
        )
        self._recorder.events_received(sum(len(request.events) for request, _, _ in accepted))

    def _rejected_result(self, request: CompleteRequest, exc: Rejected) -> CompleteBatchResult:
        with structlog.contextvars.bound_contextvars(
            task_id=str(request.task_id), attempt=request.attempt
        ):
            self._recorder.worker_call_rejected(BATCH_ROUTE, exc.reason)
        body = RejectedResponse(reason=exc.reason, message=exc.message)
        status = 404 if exc.reason == "NotFound" else 409
        return CompleteBatchResult(task_id=request.task_id, status_code=status, body=body)


def _many_params(items: list[_Prepared], now: datetime | None) -> dict[str, Any]:
    """The array parameters of `complete_many` (one element per completion)."""
    columns = {
        "task_ids": "task_id",
        "attempts": "attempt",
        "lease_tokens": "lease_token",
        "statuses": "ended",
        "retryables": "retryable",
        "results": "result",
        "errors": "error_message",
        "retry_afters": "retry_after_seconds",
        "jitters": "jitter",
        "digests": "completion_digest",
        "events": "events",
        "outputs": "outputs",
    }
    params: dict[str, Any] = {
        array: [item.params[key] for item in items] for array, key in columns.items()
    }
    params["now"] = now
    return params


def _ok_result(request: CompleteRequest, response: CompleteResponse) -> CompleteBatchResult:
    return CompleteBatchResult(task_id=request.task_id, status_code=200, body=response)


def _error_result(request: CompleteRequest, exc: ValidationFailed) -> CompleteBatchResult:
    body = ErrorResponse(error=exc.code, message=exc.message, detail=exc.detail)
    return CompleteBatchResult(task_id=request.task_id, status_code=422, body=body)
