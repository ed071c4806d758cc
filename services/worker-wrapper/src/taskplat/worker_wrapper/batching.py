"""Batched dispatcher calls: the claims of one receive, and completions under load.

Invariants:
  * `ClaimGroup`: the deliveries of one receive each ask for their claim (or withdraw: poison,
    stopped); once all of them did, one task-claim-batch call claims them all, and each gets its
    own answer or the call's error, exactly as a single claim would have given it. No failure of
    a batch call (whatever it raises) leaves a caller waiting.
  * A batch call serves several tasks, so it runs in a fresh context: its span starts a trace of
    its own instead of posing as the child of one task's attempt.
  * `CompletionBatcher`: completions are batched by turn (`turn_batching`): those ready in one
    event-loop turn go together, at most `parallel` calls in flight. A lone completion is a single
    call, made in its caller's context (its span stays in the attempt's trace); several go in one
    task-complete-batch call (10 at most). Each caller gets exactly the answer the single call
    would have given. When a batch call fails as a whole (no answer in time, or refused), each of
    its completions is sent again on its own with its own time bound, so batching never loses a
    completion and never answers one that was not answered.
  * With `linger_seconds`, a completion waits at most that long for the wrapper's other running
    tasks to complete too (`busy`: the tasks the wrapper handles), and goes at once when every
    one of them has asked (or 10 have): a lone task never waits, and under load one call carries
    the completions of the tasks that were claimed together.
  * Claims along (`claim_along`, set by the loop that claims; `claim_with_completions`): as it is
    sent, a completion call asks the loop whether it wants tasks claimed; if it does (a
    `ClaimAlong`, its slots reserved by the loop), the call is one task-complete-batch carrying
    that claim-next, made once. Its answer resolves the `ClaimAlong` with the tasks claimed;
    when it fails as a whole, the `ClaimAlong` gets the error (nothing was claimed: one
    transaction) and the completions go as if no claim had come along. Every `ClaimAlong`
    handed out is resolved, whatever happens. A dispatcher that refuses the field (422: it
    predates it) ends claims along for good.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from uuid import UUID

from taskplat.common.contracts import ClaimedResponse, CompleteRequest, CompleteResponse
from taskplat.common.contracts.internal import MAX_BATCH
from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.dispatcher_client import (
    ClaimAnswer,
    CompleteResult,
    DispatcherClient,
    DispatcherProtocolError,
    DispatcherUnavailable,
    Rejection,
)
from taskplat.worker_wrapper.turn_batching import TurnBatcher


class ClaimGroup:
    """The claims of the `expected` deliveries of one receive, made with one batch call."""

    def __init__(self, client: DispatcherClient, worker_id: str, expected: int) -> None:
        self._client = client
        self._worker_id = worker_id
        self._pending = expected
        self._asks: list[tuple[UUID, float, asyncio.Future[ClaimAnswer]]] = []
        self._call: asyncio.Future[None] | None = None
        self.claimed = 0  # Claimed answers, once the call returned
        self.settled = asyncio.Event()  # set once every delivery has its answer
        if expected <= 0:
            self.settled.set()

    async def claim(self, task_id: UUID, *, until: float) -> ClaimAnswer:
        future: asyncio.Future[ClaimAnswer] = asyncio.get_running_loop().create_future()
        self._asks.append((task_id, until, future))
        self._arrived()
        return await future

    def withdraw(self) -> None:
        """A delivery that will not claim (poison, stopped before its claim)."""
        self._arrived()

    def _arrived(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            if self._asks:
                # The call serves every delivery of the receive: it is no one's child span.
                loop = asyncio.get_running_loop()
                self._call = loop.create_task(self._send(), context=contextvars.Context())
            else:
                self.settled.set()

    async def _send(self) -> None:
        task_ids = [task_id for task_id, _, _ in self._asks]
        until = min(until for _, until, _ in self._asks)
        try:
            answers = await self._client.claim_batch(task_ids, self._worker_id, until=until)
        except Exception as exc:  # each claim gets the call's error, whatever it is
            for _, _, future in self._asks:
                if not future.done():
                    future.set_exception(exc)
        else:
            self.claimed = sum(isinstance(answer, ClaimedResponse) for answer in answers)
            for (_, _, future), answer in zip(self._asks, answers, strict=True):
                if not future.done():
                    future.set_result(answer)
        finally:
            self.settled.set()


@dataclass
class ClaimAlong:
    """A claim-next the loop wants made with a completion call: up to `limit` tasks of `queue`."""

    queue: str
    worker_id: str
    limit: int
    answer: asyncio.Future[list[ClaimedResponse]] = field(repr=False)

    def failed(self, exc: BaseException) -> None:
        if not self.answer.done():
            if not isinstance(exc, Exception):  # cancelled: the loop still gets an answer
                exc = DispatcherUnavailable(f"the completion call ended: {type(exc).__name__}")
            self.answer.set_exception(exc)


class CompletionBatcher:
    """Completion calls: single while few are in flight, batched when they pile up."""

    def __init__(
        self,
        client: DispatcherClient,
        *,
        parallel: int,
        enabled: bool,
        linger_seconds: float = 0.0,
    ) -> None:
        self._client = client
        self._enabled = enabled
        self.busy: Callable[[], int] = lambda: 0
        # Set by the loop that claims (with `claim_with_completions`): asked as a call is sent.
        self.claim_along: Callable[[], ClaimAlong | None] | None = None
        self._turns: TurnBatcher[tuple[CompleteRequest, float], CompleteResponse | Rejection] = (
            TurnBatcher(
                self._send,
                max_batch=MAX_BATCH,
                parallel=parallel,
                linger_seconds=linger_seconds,
                ready=self._all_asked,
            )
        )

    def _all_asked(self, waiting: int, sent: int) -> bool:
        return waiting + sent >= self.busy()

    @property
    def waiting(self) -> int:
        """Completions asked for and not yet sent (a call that may carry a claim is coming)."""
        return self._turns.waiting if self._enabled else 0

    async def complete(
        self, body: CompleteRequest, *, until: float
    ) -> CompleteResponse | Rejection:
        """Report a completion; raises what `DispatcherClient.complete` raises."""
        if not self._enabled:
            return await self._client.complete(body, until=until)
        return await self._turns.submit((body, until))

    async def _send(
        self, batch: list[tuple[CompleteRequest, float]]
    ) -> list[CompleteResponse | Rejection | BaseException]:
        along = self.claim_along() if self.claim_along is not None else None
        if along is not None:
            together = await self._send_along(batch, along)
            if together is not None:
                return together
        if len(batch) > 1:
            until = min(until for _, until in batch)
            try:
                answers: list[CompleteResult] = await self._client.complete_batch(
                    [body for body, _ in batch], until=until
                )
            except (DispatcherUnavailable, DispatcherProtocolError):
                pass  # the call failed as a whole: each completion again on its own
            else:
                return list(answers)
        return list(
            await asyncio.gather(
                *(self._client.complete(body, until=until) for body, until in batch),
                return_exceptions=True,
            )
        )

    async def _send_along(
        self, batch: list[tuple[CompleteRequest, float]], along: ClaimAlong
    ) -> list[CompleteResponse | Rejection | BaseException] | None:
        """The completions and the claim in one call; None when it failed as a whole (the
        claim got the error; the completions are to be sent without it)."""
        bodies = [body for body, _ in batch]
        try:
            answers, claimed = await self._client.complete_batch_and_claim(
                bodies, along.queue, along.worker_id, along.limit
            )
        except (DispatcherUnavailable, DispatcherProtocolError) as exc:
            along.failed(exc)
            if isinstance(exc, DispatcherProtocolError) and exc.status_code == 422:
                self.claim_along = None  # a dispatcher that predates `claim_next`
                get_logger().warning("claims_along_refused", error=str(exc))
            return None
        except BaseException as exc:
            along.failed(exc)
            raise
        along.answer.set_result(claimed)
        return list(answers)
