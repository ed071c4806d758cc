"""Getting work by a waiting claim: one `task-claim-next` with `wait_seconds` kept open on the
dispatcher while slots are free, and SQS long-polled beside it.

Invariants:
  * At most one waiting claim is in flight (`claim_poll.ClaimPoll`); it reserves the slots it
    asked for and brings a task of the queue as soon as one becomes Queued.
  * SQS is long-polled beside it, for the wake-ups the dispatcher's NOTIFY did not cover (a
    lost NOTIFY, a poll that failed): an idle wrapper's poll leaves one free slot to what SQS
    brings (unless it has only one), and a message that arrives while the poll holds every free
    slot waits for a slot (its visibility renewed as usual) before any new poll starts.
  * Under a backlog (the last poll came back full: two or more tasks, or every task it asked for
    when it was made under a backlog already) the loop gathers free slots as claim-ahead does, so
    one call fills them all; claim-ahead itself is not used.
  * With `claim_with_completions` (`build_wrapper` gives the completion batcher this loop's
    `claim_along`), under a backlog the claim goes along with the completion call about to be
    sent instead of a claim-next of its own: the completion batcher asks (`claim_along`) as it
    sends, and gets a claim for the free slots when no poll is in
    flight or backing off, no received message waits for a slot and the wrapper is not
    stopping; that claim is held as the poll in flight (`ClaimPoll.attach`). While completions
    wait to be sent the loop starts no claim-next itself, for at most `ALONG_WAIT_SECONDS`;
    when none do (or they went without taking it), it makes one as before.
    A claim made along comes back full when it brought every task it asked for (it never
    waits, so even one is a sign of a backlog).
  * A failing receive is logged and retried after a backoff (`ReceiveBackoff`) while the poll
    goes on; a failing poll is logged and retried after its own backoff while SQS is polled.
  * Liveness: the mark moves each time a receive returned, and each time a saturated wrapper's
    wait timed out (at most `busy_tick` apart).
  * On stop no new receive or poll starts; a waiting claim-next in flight is cancelled at once
    (`ClaimPoll.settle`: the dispatcher sees the client leave and claims nothing more for it), a
    claim gone along with completions is waited for; what was claimed runs (it is leased to
    this wrapper), all within `drain_timeout_seconds` of the stop; the messages still waiting
    for a slot are released (visible again at once).
"""

from __future__ import annotations

import asyncio
from typing import Any

from taskplat.common.contracts import ClaimedResponse
from taskplat.common.contracts.internal import MAX_BATCH
from taskplat.worker_wrapper.batching import ClaimAlong
from taskplat.worker_wrapper.claim_poll import ClaimPoll
from taskplat.worker_wrapper.intake import Delivery, SqsIntake
from taskplat.worker_wrapper.observability import IntakeHealth
from taskplat.worker_wrapper.receive_loop import ReceiveBackoff, release_deliveries
from taskplat.worker_wrapper.slots import WorkSlots

# How long the loop leaves its claim to completions waiting to be sent before it makes its own.
ALONG_WAIT_SECONDS = 0.1


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
        self._stop: asyncio.Event | None = None  # set while the loop runs
        self._along = False  # the poll in flight is a claim made along with completions
        self._answered = asyncio.Event()  # a claim made along was answered: the loop turns
        self._along_until = 0.0  # event-loop time until which the claim is left to completions
        # Read only: whether claims go along completions (`claim_along` set by `build_wrapper`).
        self._completions = slots.executor.completions

    def _leave_to_completions(self, now: float) -> bool:
        """Under a backlog, whether the claim is left to completions about to be sent (they
        take it along): only while some wait to be sent, and for at most
        `ALONG_WAIT_SECONDS` from when the loop first left it to them."""
        if not (self._backlog and self._completions.claim_along and self._completions.waiting):
            self._along_until = 0.0
            return False
        if not self._along_until:
            self._along_until = now + ALONG_WAIT_SECONDS
        if now < self._along_until:
            return True
        self._along_until = 0.0
        return False

    def claim_along(self) -> ClaimAlong | None:
        """Asked by a completion call as it is sent: a claim for the free slots to go along
        with it, under a backlog when no poll is in flight (None: no claim goes along)."""
        poll, slots = self.poll, self.slots
        if self._stop is None or self._stop.is_set() or not self._backlog or self._waiting:
            return None
        if poll.future is not None or poll.delay():
            return None
        room = slots.concurrency - slots.occupied
        if room <= 0:
            return None
        limit = min(room, MAX_BATCH)
        answer: asyncio.Future[list[ClaimedResponse]] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(lambda _: self._answered.set())
        poll.attach(limit, answer)
        self._along = True
        self._along_until = 0.0
        return ClaimAlong(poll.queue, poll.worker_id, limit, answer)

    async def run(
        self, stop: asyncio.Event, stop_wait: asyncio.Future[Any]
    ) -> asyncio.Future[list[Delivery]] | None:
        """Keep one waiting claim-next open on the dispatcher while slots are free, and long-poll
        SQS beside it; the receive still in flight when the stop came."""
        poll, slots = self.poll, self.slots
        self._stop = stop
        loop = asyncio.get_running_loop()
        receive: asyncio.Future[list[Delivery]] | None = None
        receive_failures = 0
        receive_at = 0.0  # event-loop time before which no receive starts (a backoff)
        while not stop.is_set():
            slots.freed.clear()
            self._answered.clear()
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
                # Meanwhile a claim may have gone along with completions; or completions about
                # to be sent take it along (`claim_along`), for at most `ALONG_WAIT_SECONDS`.
                if poll.future is None and not self._leave_to_completions(loop.time()):
                    poll.start(limit)
                    self._along = False
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
            wakes = {freed}
            if self._backlog and self._completions.claim_along is not None:
                # Only under a backlog can a claim go along (`claim_along`) during this wait.
                wakes.add(asyncio.ensure_future(self._answered.wait()))
            timeout = slots.busy_tick
            if poll.future is None and poll.delay():
                timeout = min(timeout, poll.delay())
            if receive is None and receive_at > loop.time():
                timeout = min(timeout, receive_at - loop.time())
            if self._along_until > loop.time():  # then the loop makes its own claim
                timeout = min(timeout, self._along_until - loop.time())
            try:
                done, _ = await asyncio.wait(
                    waits | wakes, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for each in wakes:
                    each.cancel()
            if not done and saturated:
                self.health.polled()  # saturated, yet the loop turns: that is progress
            if stop_wait.done():
                break
            if poll.future is not None and poll.future.done():
                asked = poll.slots
                claimed = poll.take()
                slots.start_claimed(claimed)
                # Under a backlog (or along with completions) a poll that brought all it asked
                # for keeps the backlog, even one task; otherwise one task is no sign of one.
                full = asked if self._along or self._backlog else max(asked, 2)
                self._backlog = bool(claimed) and len(claimed) >= full
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
        """Drain every running task, with what the poll in flight at the stop had claimed (it is
        leased to this wrapper; a waiting claim-next still open is cancelled): all within
        `drain_timeout_seconds` of the stop."""
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
