"""Claims that wait: a `task-claim-next` with `wait_seconds` that finds no task waits for one.

A worker with free slots keeps one such claim open. A new task of its queue is then claimed for
it as soon as the create commits: the create NOTIFYs `taskplat_queued` (payload: the queue), this
dispatcher hears it and the waiting claim runs again, with no SQS message in between. A create
on the dispatcher where a waiting claim of its queue waits sends no such NOTIFY: it takes that
waiter (`take`) and claims for it in the create's own transaction (one commit, no wake-up hop),
then hands it the claimed rows (`Waiter.hand`). It hears
the relay's channel too, `taskplat_outbox` (payload: the queue), which every other transition
into Queued NOTIFYs (a retry, a scheduled task come due, a replay, a routed event's task): a
waiting claim takes those tasks as well (their wake-ups are sent, then answered NotClaimed).

Invariants:
  * One LISTEN connection per dispatcher, on both channels, read on the event loop; a lost
    one is reopened after `retry_seconds`, and meanwhile waits end only at their deadline (each
    waiting claim claims once more then). A waiting claim holds no database connection.
  * A waiter is registered before its first claim, so a NOTIFY heard during that claim is not
    lost: the waiter claims again.
  * A create that finds one of this dispatcher's waiters of its queue still in its first claim
    (`waits_here`, none to `take`) wakes it after its commit instead of NOTIFYing (`wake`, as a
    notification would: it claims once more after its first claim).
  * A create that takes one of this dispatcher's waiters of its queue (`take`: the longest
    waiting whose client is still there, and only while listening) always hands it something once
    its transaction ended: the rows it claimed for it after its commit, or nothing (it then claims
    for itself, as after a notification). A taken waiter's wait does not end before that, not at its
    deadline nor when its client goes away, so rows claimed for it are always answered. A taken
    waiter is out of its queue's line: notifications meanwhile wake the others.
  * Each notification wakes one waiter of its queue, the longest waiting, not all of them (they
    would all claim, and all but one find nothing); a woken waiter whose claim came back full
    wakes the next (more tasks may be Queued). A notification that comes while every waiter of
    its queue is claiming is kept: the first of them to wait again claims once more instead.
  * `listening` is true only while the LISTEN connection is up: the dispatcher stamps
    `queues.polled_until` (creates then hold wake-ups back, migration 0016) only then, so a
    create holds back a wake-up only when its NOTIFY can reach a waiting claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Iterable, Iterator

import psycopg
from opentelemetry.metrics import CallbackOptions, Observation
from psycopg import sql

from taskplat.common.db.notify import OUTBOX_CHANNEL, QUEUED_CHANNEL
from taskplat.common.logging import get_logger

_ENDED = object()  # a wait that ended without a wake-up: timed out, or its client went away


class Waiter:
    """One waiting claim of one queue (for `worker_id`, up to `limit` tasks); woken at most once per
    `arm`, by a notification or by a create that took it (`hand`).

    A plain future, not an `asyncio.Event`: a wake resumes the waiting claim one event-loop turn
    sooner (an Event's `wait()` is a task of its own between the two)."""

    def __init__(
        self,
        queue: str,
        worker_id: str = "",
        limit: int = 1,
        gone: asyncio.Future[object] | None = None,
    ) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.limit = limit
        self.gone = gone
        self.taken = False  # a create claims for it now
        self.woken = False  # the last wait ended with a wake-up
        self.in_wait = False  # inside `wait` now (only then can a create take it)
        self._woken: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    @property
    def wake_pending(self) -> bool:
        """Woken (or handed rows) and not yet back from its wait."""
        return self._woken.done()

    def wake(self) -> bool:
        """Wake it; False when it was already woken or taken (the wake-up goes to another)."""
        if self._woken.done() or self.taken:
            return False
        self._woken.set_result(None)
        return True

    def hand(self, claimed: object | None) -> None:
        """End a take: what was claimed for it (committed), or None: it claims for itself."""
        self.taken = False
        if not self._woken.done():
            self._woken.set_result(claimed)

    async def wait(self, timeout: float) -> object | None:
        """Up to `timeout` seconds for a wake-up (or the client going away), and, once taken, until
        handed; `woken` then says it was woken, and the answer is what was claimed for it, if any.
        Only a waiter inside this wait can be taken (not one still in its first claim). The
        claim awaits its future itself, so a wake or a hand resumes it in the next turn."""
        woken = self._woken
        if not woken.done():
            loop = asyncio.get_running_loop()

            def end(_: object = None) -> None:  # timed out, or the client went away
                if not woken.done() and not self.taken:
                    woken.set_result(_ENDED)

            timer = loop.call_later(timeout, end)
            if self.gone is not None:
                self.gone.add_done_callback(end)
            self.in_wait = True
            try:
                await woken
            finally:
                self.in_wait = False
                timer.cancel()
                if self.gone is not None:
                    self.gone.remove_done_callback(end)
        answer = woken.result()
        self.woken = answer is not _ENDED
        self._woken = asyncio.get_running_loop().create_future()
        return None if answer is _ENDED else answer


class QueuedListener:
    def __init__(self, conninfo: str, *, retry_seconds: float = 1.0) -> None:
        self._conninfo = conninfo
        self._retry = retry_seconds
        self._waiters: dict[str, deque[Waiter]] = {}  # waiting now, longest waiting first
        self._live: Counter[str] = Counter()  # waiters registered, waiting or claiming
        # Queues whose notification found no waiter waiting (each of them was claiming).
        self._missed: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.listening = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.listening = False

    @contextlib.contextmanager
    def waiter(
        self,
        queue: str,
        worker_id: str = "",
        limit: int = 1,
        gone: asyncio.Future[object] | None = None,
    ) -> Iterator[Waiter]:
        """A waiter of `queue`, registered (longest waiting first) until the block ends."""
        waiter = Waiter(queue, worker_id, limit, gone)
        self._waiters.setdefault(queue, deque()).append(waiter)
        self._live[queue] += 1
        self._missed.discard(queue)  # its first claim comes after anything missed so far
        try:
            yield waiter
        finally:
            waiting = self._waiters.get(queue)
            if waiting is not None:
                with contextlib.suppress(ValueError):
                    waiting.remove(waiter)
            self._live[queue] -= 1
            if self._live[queue] <= 0:
                del self._live[queue]
                self._waiters.pop(queue, None)
                self._missed.discard(queue)

    def rearm(self, waiter: Waiter) -> None:
        """A woken waiter that claimed nothing waits again, behind the others; at once if a
        notification of its queue found no waiter meanwhile (it came during the claims)."""
        waiting = self._waiters.setdefault(waiter.queue, deque())
        with contextlib.suppress(ValueError):
            waiting.remove(waiter)
        if waiter.queue in self._missed:
            self._missed.discard(waiter.queue)
            waiter.wake()
            return
        waiting.append(waiter)

    def wake(self, queue: str) -> bool:
        """Wake the longest waiting waiter of `queue`; False when none waits (then the next
        waiter of the queue to wait again looks once more)."""
        waiting = self._waiters.get(queue)
        while waiting:
            if waiting.popleft().wake():
                return True
        if self._live[queue] > 0:  # its waiters are all claiming: one of them looks again
            self._missed.add(queue)
        return False

    def waits_here(self, queue: str) -> bool:
        """A waiting claim of `queue` is registered on this dispatcher (waiting, or in its first
        claim), and the LISTEN connection is up (the queue's wake-ups are held back for it)."""
        return self.listening and bool(self._waiters.get(queue))

    def take(self, queue: str) -> Waiter | None:
        """The longest waiting claim of `queue` on this dispatcher whose client is still there,
        out of the line, for a create to claim for (it must `hand` it something); None when none
        waits or the LISTEN connection is down (then the queue's wake-ups are not held back)."""
        waiting = self._waiters.get(queue)
        if not self.listening or not waiting:
            return None
        for waiter in list(waiting):
            if not waiter.in_wait or waiter.taken or waiter.wake_pending:
                continue
            if waiter.gone is not None and waiter.gone.done():
                continue
            waiting.remove(waiter)
            waiter.taken = True
            return waiter
        return None

    def waiting(self, queue: str) -> int:
        """Waiting claims of `queue`, waiting or claiming."""
        return self._live[queue]

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        """`taskplat.claims.waiting`: the waiting claims now open, by queue."""
        return [Observation(count, {"queue": queue}) for queue, count in list(self._live.items())]

    async def _run(self) -> None:
        log = get_logger().bind(channels=[QUEUED_CHANNEL, OUTBOX_CHANNEL])
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=5,
                    application_name="taskplat-dispatcher-listen",
                )
                async with conn:
                    for channel in (QUEUED_CHANNEL, OUTBOX_CHANNEL):
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.listening = True
                    log.info("listening")
                    async for notify in conn.notifies():
                        self.wake(notify.payload)
            except (psycopg.Error, OSError) as exc:
                log.warning("listen_lost", error=type(exc).__name__)
            finally:
                self.listening = False
            await asyncio.sleep(self._retry)
