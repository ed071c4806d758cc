"""The wrapper's waiting claim: one `task-claim-next` with `wait_seconds` while slots are free.

Invariants:
  * At most one is in flight; it reserves the slots it asked for (`slots`) until it is taken,
    so what it claims always has a slot.
  * On stop a waiting claim-next still open is cancelled at once (`settle`): its HTTP request is
    aborted, so the dispatcher sees its client leave and claims nothing more for it (a wrapper
    that stops never leaves a claim behind that would take a task for it once it is gone); what
    the dispatcher had claimed for it as it left is handed back there (failed `Drained`,
    retried at once). An answer already in is taken, and its tasks run.
  * It is not retried by the client: a failure (dispatcher unreachable, 5xx, a protocol error) is
    logged, claims nothing, and the next one starts only after a full-jitter backoff; the SQS
    long poll beside it goes on meanwhile, so no task depends on it.
  * A claim that goes along with a completion call (`attach`, no wait) is held as the poll in
    flight: the same reservation, the same answer and failure handling; it never waits on the
    dispatcher, so a stop waits for its answer and runs what it brings.
"""

from __future__ import annotations

import asyncio

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.contracts import ClaimedResponse
from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.dispatcher_client import (
    DispatcherClient,
    DispatcherProtocolError,
    DispatcherUnavailable,
)


class ClaimPoll:
    def __init__(
        self,
        client: DispatcherClient,
        queue: str,
        worker_id: str,
        *,
        wait_seconds: float,
        timeout_seconds: float,
        retry_base_seconds: float,
        retry_max_seconds: float,
    ) -> None:
        self._client = client
        self._queue = queue
        self._worker_id = worker_id
        self.wait_seconds = wait_seconds
        self._timeout = timeout_seconds
        self._retry_base = retry_base_seconds
        self._retry_max = retry_max_seconds
        self.future: asyncio.Future[list[ClaimedResponse]] | None = None
        self.slots = 0
        self._own = False  # the poll in flight is this object's claim-next call (not attached)
        self._failures = 0
        self._ready_at = 0.0  # event-loop time before which no new poll starts (a backoff)

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def reserved(self) -> int:
        """Slots held by the poll in flight (0 when none is)."""
        return self.slots if self.future is not None else 0

    def delay(self) -> float:
        """Seconds until a new poll may start (0: now)."""
        return max(0.0, self._ready_at - asyncio.get_running_loop().time())

    def start(self, limit: int) -> asyncio.Future[list[ClaimedResponse]]:
        assert self.future is None and limit > 0
        self.slots = limit
        self._own = True
        self.future = asyncio.ensure_future(
            self._client.claim_next(
                self._queue,
                self._worker_id,
                limit,
                until=asyncio.get_running_loop().time(),  # no retries: the loop starts another
                wait_seconds=self.wait_seconds,
            )
        )
        return self.future

    def attach(self, limit: int, answer: asyncio.Future[list[ClaimedResponse]]) -> None:
        """Hold a claim made along with a completion call as the poll in flight."""
        assert self.future is None and limit > 0
        self.slots = limit
        self._own = False
        self.future = answer

    def take(self) -> list[ClaimedResponse]:
        """The answer of the finished poll (none after a failure, which is logged); frees its
        reservation."""
        future, self.future = self.future, None
        assert future is not None and future.done()
        try:
            claimed = future.result()
        except (DispatcherUnavailable, DispatcherProtocolError) as exc:
            self._failed(str(exc))
            return []
        except Exception as exc:  # the loop must not die of one call
            self._failed(f"{type(exc).__name__}: {exc}")
            return []
        self._failures = 0
        return claimed

    def _failed(self, error: str) -> None:
        self._failures += 1
        delay = full_jitter_delay(self._retry_base, self._retry_max, self._failures)
        self._ready_at = asyncio.get_running_loop().time() + max(delay, self._retry_base)
        get_logger().warning("claim_poll_failed", error=error, failures=self._failures)

    async def settle(self) -> list[ClaimedResponse]:
        """On stop: take the answer of the poll in flight. A waiting claim-next not answered yet
        is cancelled (its request aborted: the dispatcher stops waiting for this wrapper); a
        claim attached to a completion call is waited for (bounded by its own timeout)."""
        if self.future is None:
            return []
        if self._own and not self.future.done():
            future, self.future = self.future, None
            future.cancel()
            await asyncio.wait({future})  # the request is aborted before the stop goes on
            if future.cancelled():
                get_logger().info("claim_poll_cancelled", queue=self._queue)
                return []
            self.future = future  # answered meanwhile: take it
        await asyncio.wait({self.future}, timeout=self.wait_seconds + self._timeout + 1)
        if not self.future.done():  # pragma: no cover - the client's timeout ends it first
            self.future = None
            return []
        return self.take()
