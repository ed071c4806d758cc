"""Getting work from SQS: long-poll the queue's wake-ups while slots are free, run them.

Invariants:
  * A receive asks for no more messages than there are free slots (and at most 10); a saturated
    wrapper waits for a slot (at most `busy_tick` at a time) before it receives again.
  * An idle wrapper always long-polls SQS, so the wake-up guarantee depends on nothing else:
    claim-ahead (`claim_ahead.ClaimAhead`, when configured) only fills free slots between two
    receives under a backlog, and its failure ends the backlog, never the loop.
  * A failing receive (SQS down, queue missing) is logged and retried with a full-jitter backoff
    (`ReceiveBackoff`); the loop never dies of an error, and a failing receive does not move the
    liveness mark.
  * Liveness: the mark moves each time a receive returned, and each time a saturated wrapper's
    wait for a free slot timed out (at most `busy_tick` apart, as a poll).
  * On stop no new receive starts; the receive in flight is handed back to the caller, whose
    messages are released (visible again at once, `release_deliveries`) for another worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.contracts.internal import MAX_BATCH
from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.claim_ahead import ClaimAhead
from taskplat.worker_wrapper.intake import Delivery, SqsIntake
from taskplat.worker_wrapper.observability import IntakeHealth
from taskplat.worker_wrapper.slots import WorkSlots


class ReceiveBackoff:
    """The pause after a failed receive, logged; shared by every loop that long-polls SQS."""

    def __init__(
        self, health: IntakeHealth, *, retry_base_seconds: float, retry_max_seconds: float
    ) -> None:
        self._health = health
        self._retry_base = retry_base_seconds
        self._retry_max = retry_max_seconds
        self.log = get_logger()

    def failed(self, exc: Exception, failures: int) -> float:
        """Log a failed receive (the `failures`-th in a row); the backoff before the next."""
        self._health.poll_failed()
        self.log.warning("sqs_receive_failed", error=str(exc), failures=failures)
        delay = full_jitter_delay(self._retry_base, self._retry_max, failures)
        return max(delay, self._retry_base)


async def release_deliveries(intake: SqsIntake, deliveries: list[Delivery]) -> None:
    """Hand back deliveries this wrapper will not run (visible again at once)."""
    log = get_logger()
    for delivery in deliveries:
        await intake.release(delivery)
        log.info("message_released_at_shutdown", message_id=delivery.message_id)


class ReceiveLoop:
    def __init__(
        self,
        intake: SqsIntake,
        slots: WorkSlots,
        health: IntakeHealth,
        backoff: ReceiveBackoff,
        claim_ahead: ClaimAhead | None = None,
    ) -> None:
        self.intake = intake
        self.slots = slots
        self.health = health
        self._backoff = backoff
        self._claim_ahead = claim_ahead

    async def run(
        self, stop: asyncio.Event, stop_wait: asyncio.Future[Any]
    ) -> asyncio.Future[list[Delivery]] | None:
        """Long-poll SQS while slots are free (claiming ahead under a backlog); the receive
        still in flight when the stop came."""
        slots = self.slots
        failures = 0
        while not stop.is_set():
            free = slots.concurrency - slots.occupied
            if free <= 0:
                if not await slots.slot_or_stop(stop_wait, slots.busy_tick):
                    self.health.polled()  # saturated, yet the loop turns: that is progress
                continue
            if self._claim_ahead is not None and self._claim_ahead.backlog:
                if await self._claim_ahead.fill(free, stop_wait):
                    continue
            wanted = min(free, MAX_BATCH)
            receive = asyncio.ensure_future(self.intake.receive(wanted))
            await asyncio.wait({receive, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not receive.done():
                return receive
            try:
                deliveries = receive.result()
            except Exception as exc:
                failures += 1
                await asyncio.wait({stop_wait}, timeout=self._backoff.failed(exc, failures))
                continue
            self.health.polled()
            failures = 0
            claimed_before = slots.executor.wakeups_claimed
            slots.start_deliveries(deliveries)
            if self._claim_ahead is not None:
                self._claim_ahead.after_receive(wanted, len(deliveries), claimed_before)
        return None

    async def drain_after_stop(self) -> None:
        """Drain the tasks running at the stop, within `drain_timeout_seconds`."""
        await self.slots.drain(self.slots.drain_settings.drain_timeout_seconds)

    async def release_waiting(self) -> None:
        """Nothing waits here: every delivery received got a slot at once."""
