"""Getting work by claiming ahead: under a backlog, fill free slots with `task-claim-next`.

Invariants:
  * Claim-ahead is only an accelerator under a backlog, between two SQS receives: a backlog
    starts when a receive for two or more messages came back full and (once its claims are
    answered) claimed at least one of its tasks; it lasts for as long as claim-next comes back
    full; then the wrapper long-polls SQS again. An idle wrapper always long-polls, so the
    wake-up guarantee does not depend on claim-ahead.
  * Before a claim-next the loop waits at most `CLAIM_AHEAD_GATHER_SECONDS` for every slot (at
    most 10) to be free, so one call fills them all; it asks for no more tasks than free slots.
  * A claim-next waits until every claim of a received wake-up was answered, so it never takes a
    task whose own wake-up this wrapper is claiming. When every wake-up of the full receive was
    stale (claimed none), there is no sign of Queued tasks: the backlog ends without a call.
  * A failed claim-next (dispatcher unreachable, protocol error, after the client's retries
    within `claim_next_timeout_seconds`) is logged and only ends the backlog.
  * Its claim-next is always a call of its own: claims that go along with completion calls
    (`claim_with_completions`) are the waiting-claim loop's (`waiting_claim`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from taskplat.common.contracts.internal import MAX_BATCH
from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.dispatcher_client import DispatcherProtocolError, DispatcherUnavailable
from taskplat.worker_wrapper.slots import WorkSlots


class ClaimAhead:
    def __init__(self, slots: WorkSlots, *, claim_next_timeout_seconds: float) -> None:
        self.slots = slots
        self._timeout = claim_next_timeout_seconds
        self.backlog = False
        # The executor's count of claimed wake-ups before the receive that found a backlog.
        self._claimed_before_receive: int | None = None
        self.log = get_logger()

    def after_receive(self, wanted: int, received: int, claimed_before: int) -> None:
        """Note a receive for `wanted` messages that brought `received` (the executor had
        claimed `claimed_before` wake-ups before it): a backlog when it came back full."""
        self.backlog = received >= max(wanted, 2)
        self._claimed_before_receive = claimed_before if self.backlog else None

    async def fill(self, free: int, stop_wait: asyncio.Future[Any]) -> bool:
        """Fill free slots from the dispatcher (after gathering a few more); False when that
        claimed nothing."""
        free = await self.slots.gather_free_slots(free, stop_wait)
        executor = self.slots.executor
        await executor.claims_settled.wait()
        before, self._claimed_before_receive = self._claimed_before_receive, None
        if before is not None and executor.wakeups_claimed == before:
            # Every wake-up of that full receive was stale (its task claimed ahead, finished):
            # no sign of Queued tasks, so long-poll again instead of asking for them.
            self.backlog = False
            return False
        limit = min(free, MAX_BATCH)
        until = asyncio.get_running_loop().time() + self._timeout
        try:
            claimed = await executor.client.claim_next(
                executor.telemetry.queue, executor.settings.worker_id, limit, until=until
            )
        except (DispatcherUnavailable, DispatcherProtocolError) as exc:
            self.log.warning("claim_ahead_failed", error=str(exc))
            claimed = []
        self.slots.start_claimed(claimed)
        self.backlog = len(claimed) >= limit
        return bool(claimed)
