"""Getting work by a waiting claim: one `task-claim-next` with `wait_seconds` kept open on the
dispatcher while slots are free, and SQS long-polled beside it.

Invariants:
  * At most one waiting claim is in flight (`claim_poll.ClaimPoll`); it reserves the slots it
    asked for and brings a task of the queue as soon as one becomes Queued.
  * SQS is long-polled beside it, for the wake-ups the dispatcher's NOTIFY did not cover (a
    lost NOTIFY, a poll that failed): an idle wrapper's poll leaves one free slot to what SQS
    brings (unless it has only one), and a message that arrives while the poll holds every free
    slot waits for a slot (its visibility renewed as usual) before any new poll starts.
  * Under a backlog (the last poll came back full, two or more tasks) the loop gathers free slots
    as claim-ahead does, so one call fills them all; claim-ahead itself is not used.
  * A failing receive is logged and retried after a backoff (`ReceiveBackoff`) while the poll
    goes on; a failing poll is logged and retried after its own backoff while SQS is polled.
  * Liveness: the mark moves each time a receive returned, and each time a saturated wrapper's
    wait timed out (at most `busy_tick` apart).
  * On stop no new receive or poll starts; the poll in flight is waited for and what it claimed
    runs (it is leased to this wrapper), all within `drain_timeout_seconds` of the stop; the
    messages still waiting for a slot are released (visible again at once).
"""

from __future__ import annotations

import asyncio
from typing import Any

from taskplat.common.contracts.internal import MAX_BATCH
from taskplat.worker_wrapper.claim_poll import ClaimPoll
from taskplat.worker_wrapper.intake import Delivery, SqsIntake
from taskplat.worker_wrapper.observability import IntakeHealth
from taskplat.worker_wrapper.receive_loop import ReceiveBackoff, release_deliveries
from taskplat.worker_wrapper.slots import WorkSlots


class WaitingClaimLoop:
    def __init__(
        self,
        poll: ClaimPoll,
        intake: SqsIntake,
        slots: WorkSlots,
        health: IntakeHealth,
        backoff: ReceiveBackoff,
    ) -> None:
        self.poll = poll
        self.intake = intake
        self.slots = slots
        self.health = health
        self._backoff = backoff
        self._backlog = False
        self._waiting: list[Delivery] = []  # received while the poll held every free slot

    async def run(
        self, stop: asyncio.Event, stop_wait: asyncio.Future[Any]
    ) -> asyncio.Future[list[Delivery]] | None:
        """Keep one waiting claim-next open on the dispatcher while slots are free, and long-poll
        SQS beside it; the receive still in flight when the stop came."""
        poll, slots = self.poll, self.slots
        loop = asyncio.get_running_loop()
        receive: asyncio.Future[list[Delivery]] | None = None
        receive_failures = 0
        receive_at = 0.0  # event-loop time before which no receive starts (a backoff)
        while not stop.is_set():
            slots.freed.clear()
            self._start_waiting()
            room = slots.concurrency - slots.occupied - poll.reserved
            if poll.future is None and room > 0 and not self._waiting and not poll.delay():
                if self._backlog:  # the last poll came back full: let a few more slots free up
                    room = await slots.gather_free_slots(room, stop_wait)
                    if stop_wait.done():
                        break
                    limit = min(room, MAX_BATCH)
                else:  # it may wait long: one slot stays free for a wake-up SQS brings meanwhile
                    limit = min(room - 1 if room > 1 else room, MAX_BATCH)
                poll.start(limit)
                room = slots.concurrency - slots.occupied - poll.reserved
            if receive is None and not self._waiting and loop.time() >= receive_at:
                if room > 0 or poll.future is not None:
                    # Beside a poll holding every free slot, one message: it waits for a slot.
                    receive = asyncio.ensure_future(
                        self.intake.receive(max(1, min(room, MAX_BATCH)))
                    )
            saturated = receive is None and poll.future is None and room <= 0
            waits: set[asyncio.Future[Any]] = {stop_wait}
            waits.update(each for each in (receive, poll.future) if each is not None)
            freed = asyncio.ensure_future(slots.freed.wait())
            timeout = slots.busy_tick
            if poll.future is None and poll.delay():
                timeout = min(timeout, poll.delay())
            if receive is None and receive_at > loop.time():
                timeout = min(timeout, receive_at - loop.time())
            try:
                done, _ = await asyncio.wait(
                    waits | {freed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                freed.cancel()
            if not done and saturated:
                self.health.polled()  # saturated, yet the loop turns: that is progress
            if stop_wait.done():
                break
            if poll.future is not None and poll.future.done():
                asked = poll.slots
                claimed = poll.take()
                slots.start_claimed(claimed)
                self._backlog = len(claimed) >= max(asked, 2)
            if receive is not None and receive.done():
                finished, receive = receive, None
                try:
                    deliveries = finished.result()
                except Exception as exc:
                    receive_failures += 1
                    receive_at = loop.time() + self._backoff.failed(exc, receive_failures)
                    continue
                self.health.polled()
                receive_failures = 0
                self._waiting.extend(deliveries)
                self._start_waiting()
        return receive

    def _start_waiting(self) -> None:
        """Start the received deliveries that have a slot (the poll's reservation aside)."""
        if not self._waiting:
            return
        slots = self.slots
        room = max(0, slots.concurrency - slots.occupied - self.poll.reserved)
        ready, self._waiting = self._waiting[:room], self._waiting[room:]
        if ready:
            slots.start_deliveries(ready)

    async def drain_after_stop(self) -> None:
        """Drain every running task, with what the poll in flight at the stop claims (it is
        leased to this wrapper): all within `drain_timeout_seconds` of the stop."""
        loop = asyncio.get_running_loop()
        drain_timeout = self.slots.drain_settings.drain_timeout_seconds
        deadline = loop.time() + drain_timeout
        settle = asyncio.ensure_future(self.poll.settle())
        await self.slots.drain(drain_timeout)  # the tasks running at the stop
        self.slots.start_claimed(await settle)
        await self.slots.drain(max(0.0, deadline - loop.time()))

    async def release_waiting(self) -> None:
        """Hand back the deliveries that never got a slot (visible again at once)."""
        waiting, self._waiting = self._waiting, []
        await release_deliveries(self.intake, waiting)
