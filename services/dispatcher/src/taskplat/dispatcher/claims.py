"""Claims: `task-claim`, `task-claim-batch` and `task-claim-next`.

Invariants:
  * A claim is one statement: the Queued -> Running transition with a fresh lease token and the
    attempt record; it commits on return (autocommit), so a Claimed answer is durable.
  * A batch claim moves every Queued task it names in one statement (rows locked in task_id
    order) and classifies all the others with one read taken after it; a task named twice in one
    batch is claimed at most once (its later occurrences answer NotClaimed AlreadyRunning).
  * claim-next takes only Queued tasks of the named queue that no one else is claiming (SKIP
    LOCKED), oldest first, never more than `max`, and never a task of a `runtime: lambda` job
    (the relay claims those for their function).
  * No claim hands out a task of a paused queue: a single or batch claim of one answers NotClaimed
    `Paused`, claim-next answers no task.
  * A claim-next that comes back full (two or more tasks, as many as asked) stamps its queue's
    `claimed_ahead_at` (migration 0013), at most once per `CLAIMED_AHEAD_STAMP_SECONDS` per queue
    and dispatcher: the relay then holds back wake-ups deep in that queue's backlog. The stamp is
    its own statement after the claim committed; a failed stamp fails nothing (logged).
  * A claim-next with `wait_seconds` that finds no task waits for one (`claim_waits`), at most
    `claim_max_wait_seconds`, and claims again each time a create of its queue NOTIFYs it and
    once more at the end of the wait; it answers as soon as it claimed something, and claims
    nothing more once its client went away (`gone`); what it claimed as its client went is
    handed back by the service (failed `Drained`, retried at once). While it waits, and the
    dispatcher listens, the queue's `polled_until` is stamped (at most every half wait per queue
    and dispatcher; its own statement, a failed stamp fails nothing): creates then hold the
    queue's wake-ups back for `polled_wakeup_delay_seconds`.
  * A waiting claim may be claimed for by a create of its queue on this dispatcher: the same
    statements (`claim_next_statements`) in the create's transaction, whose rows the waiting
    claim answers (`claim_next_answer`) once that transaction committed.
  * A claim-next carried by a completion batch is the same statements, run in the batch's
    transaction, which commits the completions and the claim together; it never waits, and it
    is read, answered, recorded and stamped (`claim_next_answer`) only after that commit.
  * Each claim and each NotClaimed answer is recorded after the statement committed.
  * Every Claimed answer carries the attempt token of the attempt it claimed (and, for an
    untrusted task, its capability token), issued from the committed row.
  * A claim held back by a limit of its queue (migration 0028: the start's trigger decides, in
    the claim's own statement) answers NotClaimed `ConcurrencyLimited`, `KeyConcurrencyLimited`
    or `RateLimited` with `retry_after_ms`; the task stays Queued with its place. A waiting
    claim whose queue is held back waits at most that long before it claims again (an end of
    a task of the queue also wakes it, by NOTIFY); whether a limit holds it back is read
    after each of its claims, in the claim's round trip.
  * No untrusted task is handed out without its capability token: while the dispatcher has no
    capability keys, every claim statement is told so (`capability_keys`, with the
    `untrusted_operators` setting) and takes no untrusted task (migration 0024); the task stays
    Queued, unchanged. A claim of one by id answers NotClaimed `MissingCapabilityKeys` with a
    detail naming the setting; a claim-next that came back short names the untrusted tasks it
    left, read after its claim in the same transaction and round trip
    (`claim_next_statements`), so its answer waits for no second statement. Each refused task
    counts in `taskplat.claims.refused`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from taskplat.common.claim_answer import claimed_response
from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    ClaimedResponse,
    NotClaimedItem,
    NotClaimedReason,
    NotClaimedResponse,
)
from taskplat.common.contracts.internal import LIMITED_REASONS
from taskplat.common.db.round_trip import Statement, transaction_in_one_round_trip
from taskplat.common.logging import get_logger
from taskplat.dispatcher import untrusted
from taskplat.dispatcher.claim_waits import QueuedListener
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import batch, queues
from taskplat.dispatcher.repository import tasks as repo
from taskplat.dispatcher.service_rules import NOT_CLAIMED_REASONS
from taskplat.dispatcher.settings import DispatcherSettings
from taskplat.dispatcher.tokens import TokenIssuer

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]
ClaimAnswer = ClaimedResponse | NotClaimedResponse

CLAIMED_AHEAD_STAMP_SECONDS = 1.0


@dataclass(frozen=True)
class ClaimedRows:
    """A committed claim-next: the rows it claimed and, while the dispatcher has no capability
    keys, the untrusted Queued tasks of its queue it left (read after it, in its transaction)."""

    rows: list[Row]
    left_untrusted: list[UUID]


# A task held back by a limit that lifted between the claim and the read of why: try again soon.
LIMIT_LIFTED_RETRY_MS = 100


def _reason(fence: Row | None, *, capability_keys: bool = True) -> NotClaimedReason:
    """Why a claim took nothing. A Queued task the claim did not take is of a paused queue,
    untrusted (when the claim ran without capability keys), or held back by a limit of its
    queue."""
    if fence is None:
        return "NotFound"
    if fence["status"] == "Queued" and fence.get("paused"):
        return "Paused"
    if fence["status"] == "Queued" and fence.get("untrusted") and not capability_keys:
        return "MissingCapabilityKeys"
    if fence["status"] == "Queued" and fence.get("limited"):
        limited: NotClaimedReason = fence["limited"]
        return limited
    if fence["status"] == "Queued" and fence.get("has_limits") and not fence.get("expired"):
        return "ConcurrencyLimited"  # held back by a limit that lifted since: soon again
    return NOT_CLAIMED_REASONS.get(fence["status"], "NotQueued")


def _retry_after_ms(reason: NotClaimedReason, fence: Row | None) -> int | None:
    if reason not in LIMITED_REASONS:
        return None
    found = fence.get("retry_after_ms") if fence is not None else None
    return int(found) if found is not None else LIMIT_LIFTED_RETRY_MS


def _not_claimed(reason: NotClaimedReason, fence: Row | None = None) -> NotClaimedResponse:
    detail = untrusted.NOT_CLAIMED_DETAIL if reason == "MissingCapabilityKeys" else None
    return NotClaimedResponse(
        reason=reason, detail=detail, retry_after_ms=_retry_after_ms(reason, fence)
    )


class Claims:
    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        clock: Clock,
        settings: DispatcherSettings,
        recorder: Recorder,
        tokens: TokenIssuer,
        listener: QueuedListener | None = None,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._settings = settings
        self._recorder = recorder
        self._tokens = tokens
        self._listener = listener
        self._capability_keys = untrusted.capability_keys_configured(settings)
        self._untrusted_operators = list(settings.untrusted_operators)
        self._claimed_ahead_stamped: dict[str, float] = {}  # queue -> monotonic time
        self._polled_stamped_until: dict[str, float] = {}  # queue -> monotonic time

    def _claimed(self, row: Row) -> ClaimedResponse:
        return claimed_response(
            row,
            attempt_token=self._tokens.attempt_token(row),
            capability_token=self._tokens.capability_token(row),
            trust=self._tokens.trust(row),
        )

    def _params(self, worker_id: str) -> dict[str, Any]:
        return {
            "worker_id": worker_id,
            "lease_seconds": self._settings.lease_ttl_seconds,
            "default_timeout_seconds": self._settings.default_timeout_seconds,
            "now": self._clock.sql_now(),
            "capability_keys": self._capability_keys,
            "untrusted_operators": self._untrusted_operators,
        }

    async def claim(self, task_id: UUID, worker_id: str) -> ClaimAnswer:
        params = {**self._params(worker_id), "task_id": task_id, "lease_token": uuid4()}
        async with self._pool.connection() as conn:
            row = await repo.claim_task(conn, params)  # one statement: committed on return
            if row is not None:
                self._recorder.task_claimed(row)
                return self._claimed(row)
            fences = await batch.read_fences(
                conn, [task_id], self._untrusted_operators, self._clock.sql_now()
            )
        fence = fences.get(task_id)
        reason = _reason(fence, capability_keys=self._capability_keys)
        self._not_claimed_recorded(task_id, worker_id, reason, fence)
        return _not_claimed(reason, fence)

    def _not_claimed_recorded(
        self, task_id: UUID, worker_id: str, reason: NotClaimedReason, fence: Row | None
    ) -> None:
        self._recorder.claim_not_claimed(task_id, worker_id, reason)
        if reason == "MissingCapabilityKeys":
            self._recorder.claims_refused([task_id], worker_id, untrusted.MISSING_SETTING)
        if reason in LIMITED_REASONS and fence is not None:
            self._recorder.claims_limited(fence["queue"], reason)

    async def claim_batch(self, task_ids: Sequence[UUID], worker_id: str) -> list[ClaimAnswer]:
        distinct = list(dict.fromkeys(task_ids))
        async with self._pool.connection() as conn:
            rows = await batch.claim_tasks(conn, {**self._params(worker_id), "task_ids": distinct})
            claimed = {row["task_id"]: row for row in rows}
            others = [task_id for task_id in distinct if task_id not in claimed]
            fences = (
                await batch.read_fences(
                    conn, others, self._untrusted_operators, self._clock.sql_now()
                )
                if others
                else {}
            )
        for row in rows:
            self._recorder.task_claimed(row)
        answers: list[ClaimAnswer] = []
        answered: set[UUID] = set()
        for task_id in task_ids:
            if task_id in claimed and task_id not in answered:
                answers.append(self._claimed(claimed[task_id]))
            else:
                fence = fences.get(task_id)
                reason: NotClaimedReason = (
                    "AlreadyRunning"
                    if task_id in claimed
                    else _reason(fence, capability_keys=self._capability_keys)
                )
                self._not_claimed_recorded(task_id, worker_id, reason, fence)
                answers.append(_not_claimed(reason, fence))
            answered.add(task_id)
        return answers

    def _left_untrusted(self, worker_id: str, task_ids: list[UUID]) -> list[NotClaimedItem]:
        """The untrusted tasks a claim-next left for want of capability keys, counted."""
        if task_ids:
            self._recorder.claims_refused(task_ids, worker_id, untrusted.MISSING_SETTING)
        detail = untrusted.NOT_CLAIMED_DETAIL
        return [
            NotClaimedItem(task_id=task_id, reason="MissingCapabilityKeys", detail=detail)
            for task_id in task_ids
        ]

    async def claim_next(
        self,
        queue: str,
        worker_id: str,
        limit: int,
        *,
        wait_seconds: float = 0.0,
        gone: asyncio.Future[object] | None = None,
    ) -> tuple[list[ClaimedResponse], list[NotClaimedItem]]:
        """Up to `limit` Queued tasks of `queue`; with `wait_seconds`, wait for one if none is.
        With them, the untrusted tasks it left for want of capability keys."""
        wait = min(wait_seconds, self._settings.claim_max_wait_seconds)
        listener = self._listener
        if wait <= 0 or listener is None:
            answer, _ = await self._claim_next_now(queue, worker_id, limit, stamp_polled=0.0)
            return answer
        if gone is not None and gone.done():  # the client left before its claim began
            return [], []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        # Registered before the first claim: no NOTIFY is missed.
        with listener.waiter(queue, worker_id, limit, gone) as waiter:
            stamp = wait if listener.listening else 0.0
            while True:
                answer, limited = await self._claim_next_now(
                    queue, worker_id, limit, stamp_polled=stamp, read_limit=True
                )
                stamp = 0.0
                if answer[0]:
                    if len(answer[0]) >= limit:
                        listener.wake(queue)  # more may be Queued: the next waiter looks too
                    return answer
                left = deadline - loop.time()
                if left <= 0 or (gone is not None and gone.done()):
                    return answer
                held = self._held_back_ms(queue, limited)
                handed = await waiter.wait(left if held is None else min(left, held / 1000))
                if isinstance(handed, ClaimedRows):  # claimed for it by a create, committed
                    if len(handed.rows) >= limit:
                        listener.wake(queue)
                    return await self.claim_next_answer(None, queue, worker_id, limit, handed)
                if gone is not None and gone.done():
                    return answer
                listener.rearm(waiter)

    def _held_back_ms(self, queue: str, row: Row | None) -> int | None:
        """While the queue is at its concurrency limit or out of rate tokens (`row`, read with
        the claim), when to claim again (an end of one of its tasks wakes the waiter sooner);
        None otherwise."""
        if row is None:
            return None
        self._recorder.claims_limited(queue, row["reason"])
        return int(row["retry_after_ms"])

    def claim_next_params(self, queue: str, worker_id: str, limit: int) -> dict[str, Any]:
        """The parameters of the claim-next statement (`batch.sql: claim_next`)."""
        return {**self._params(worker_id), "queue": queue, "max": limit}

    def claim_next_statements(self, queue: str, worker_id: str, limit: int) -> list[Statement]:
        """The claim-next statement (no wait) and, while this dispatcher has no capability keys,
        the read of the untrusted tasks it left after it: run them in one transaction, sent
        together (`transaction_in_one_round_trip`), and make their rows `claimed_rows`."""
        params = self.claim_next_params(queue, worker_id, limit)
        statements: list[Statement] = [(batch.Q["claim_next"], params)]
        if not self._capability_keys:
            statements.append((batch.Q["refused_untrusted"], params))
        return statements

    @staticmethod
    def claimed_rows(results: Sequence[list[Row]]) -> ClaimedRows:
        """The rows of `claim_next_statements`, committed."""
        left = [row["task_id"] for row in results[1]] if len(results) > 1 else []
        return ClaimedRows(results[0], left)

    async def claim_next_answer(
        self, conn: Conn | None, queue: str, worker_id: str, limit: int, claimed: ClaimedRows
    ) -> tuple[list[ClaimedResponse], list[NotClaimedItem]]:
        """Answer a committed claim-next: stamp a full one's queue (on `conn`, else on a
        connection of the pool), record, issue the tokens; and name the untrusted tasks it left
        (as many as it came back short), counted."""
        rows = claimed.rows
        if len(rows) >= max(limit, 2):
            await self._stamp_claimed_ahead(conn, queue)
        self._recorder.tasks_claimed(rows)
        answers = [self._claimed(row) for row in rows]
        left = claimed.left_untrusted[: max(0, limit - len(rows))]
        return answers, self._left_untrusted(worker_id, left)

    async def _claim_next_now(
        self,
        queue: str,
        worker_id: str,
        limit: int,
        *,
        stamp_polled: float,
        read_limit: bool = False,
    ) -> tuple[tuple[list[ClaimedResponse], list[NotClaimedItem]], Row | None]:
        """The claim, answered; with `read_limit` (a waiting claim's), also whether a limit
        holds the queue back (`limit_retry_after`), read after the claim in its round trip."""
        async with self._pool.connection() as conn:
            if stamp_polled > 0:
                await self._stamp_polled(conn, queue, stamp_polled)
            statements = self.claim_next_statements(queue, worker_id, limit)
            if read_limit:
                params = {"queue": queue, "now": self._clock.sql_now()}
                statements.append((queues.Q["limit_retry_after"], params))
            results = await transaction_in_one_round_trip(conn, statements)  # committed
            limited = results.pop() if read_limit else []
            claimed = self.claimed_rows(results)
            answer = await self.claim_next_answer(conn, queue, worker_id, limit, claimed)
        return answer, (limited[0] if limited else None)

    async def _stamp_polled(self, conn: Conn, queue: str, wait: float) -> None:
        now = time.monotonic()
        if self._polled_stamped_until.get(queue, -math.inf) - now > wait / 2:
            return
        self._polled_stamped_until[queue] = now + wait
        try:
            await queues.mark_polled(conn, queue, wait, self._clock.sql_now())
        except psycopg.Error as exc:  # a hint for creates: the claim stands without it
            get_logger().warning("polled_not_stamped", queue=queue, error=str(exc))

    async def _stamp_claimed_ahead(self, conn: Conn | None, queue: str) -> None:
        now = time.monotonic()
        if now - self._claimed_ahead_stamped.get(queue, -math.inf) < CLAIMED_AHEAD_STAMP_SECONDS:
            return
        self._claimed_ahead_stamped[queue] = now
        try:
            if conn is None:
                async with self._pool.connection() as own:
                    await queues.mark_claimed_ahead(own, queue, self._clock.sql_now())
            else:
                await queues.mark_claimed_ahead(conn, queue, self._clock.sql_now())
        except psycopg.Error as exc:  # a hint for the relay: the claim stands without it
            get_logger().warning("claimed_ahead_not_stamped", queue=queue, error=str(exc))
