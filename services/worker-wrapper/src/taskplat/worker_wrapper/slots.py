"""The wrapper's slots: what every way of getting work shares (start, track, free, drain).

Invariants:
  * A slot holds one delivery or claimed task from its receive or claim until its operator
    exits; with `report_in_background` the outcome is then reported (the lease kept) while the
    slot runs the next task, and only the reports beyond `concurrency` still hold a slot. So at
    most `concurrency` operators run, and at most 2 x `concurrency` tasks are handled, at once.
  * The deliveries of one receive claim with one batch call when there are more of them than
    `parallel_calls` (with `batch_calls`), else with one claim call each.
  * The handling of one delivery or claimed task never breaks another: its failure is logged
    and frees its slot.
  * `freed` is set each time a slot frees up (an operator exited with reports in the
    background, or a task's handling ended): the loops wait on it, never on a timer alone.
  * Under a backlog the loops may wait at most `CLAIM_AHEAD_GATHER_SECONDS` for more slots to
    free up (`gather_free_slots`), so one claim-next call fills several.
  * `drain` gives the running tasks their time, then stops the rest (process group killed,
    reported Failed with `reason: Drained`) within `kill_grace_seconds` plus the report timeout;
    a report still stuck then is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from taskplat.common.contracts import ClaimedResponse
from taskplat.common.contracts.internal import MAX_BATCH
from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.batching import ClaimGroup
from taskplat.worker_wrapper.execution import TaskExecutor
from taskplat.worker_wrapper.intake import Delivery
from taskplat.worker_wrapper.outcomes import Abort
from taskplat.worker_wrapper.racing import cancel_and_wait

# Under a backlog, how long the loop may wait for more slots to free up before one claim-next.
CLAIM_AHEAD_GATHER_SECONDS = 0.02


@dataclass(frozen=True)
class DrainSettings:
    drain_timeout_seconds: float
    report_timeout_seconds: float
    kill_grace_seconds: float
    receive_wait_seconds: float


class WorkSlots:
    def __init__(
        self,
        executor: TaskExecutor,
        *,
        concurrency: int,
        drain: DrainSettings,
        report_in_background: bool,
        batch_calls: bool,
        parallel_calls: int,
    ) -> None:
        self.executor = executor
        self.concurrency = concurrency
        self.drain_settings = drain
        self._report_in_background = report_in_background
        self._batch_calls = batch_calls
        self._parallel_calls = parallel_calls
        self._running: dict[asyncio.Future[None], Abort] = {}  # every task handled
        self._reporting: set[asyncio.Future[None]] = set()  # operator exited, reporting
        self.freed = asyncio.Event()
        executor.completions.busy = lambda: len(self._running)
        self.log = get_logger()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def reporting(self) -> int:
        """Tasks whose operator exited and whose outcome is being reported."""
        return len(self._reporting)

    @property
    def occupied(self) -> int:
        """Slots in use: tasks before their operator exited, and reports beyond `concurrency`."""
        reporting = len(self._reporting)
        return len(self._running) - reporting + max(0, reporting - self.concurrency)

    @property
    def busy_tick(self) -> float:
        """The longest a loop waits for a slot before it turns (and marks itself alive)."""
        return max(1.0, self.drain_settings.receive_wait_seconds)

    def start_deliveries(self, deliveries: list[Delivery]) -> None:
        group = None
        if self._batch_calls and len(deliveries) > self._parallel_calls:
            group = ClaimGroup(
                self.executor.client, self.executor.settings.worker_id, len(deliveries)
            )
        for delivery in deliveries:
            self._track(self._handle(delivery, group))

    def start_claimed(self, claimed: list[ClaimedResponse]) -> None:
        for each in claimed:
            self._track(self._run_claimed(each))

    def _track(self, work: Callable[[Abort], Awaitable[None]]) -> None:
        abort = Abort()
        task = asyncio.ensure_future(work(abort))
        self._running[task] = abort
        if self._report_in_background:
            abort.when_operator_exits(lambda: self._reports(task))
        task.add_done_callback(self._untrack)

    def _reports(self, task: asyncio.Future[None]) -> None:
        if task in self._running:
            self._reporting.add(task)
            self.freed.set()

    def _untrack(self, task: asyncio.Future[None]) -> None:
        self._running.pop(task, None)
        self._reporting.discard(task)
        self.freed.set()

    def _handle(
        self, delivery: Delivery, group: ClaimGroup | None
    ) -> Callable[[Abort], Awaitable[None]]:
        async def handle(abort: Abort) -> None:
            try:
                await self.executor.handle(delivery, abort, group)
            except Exception:
                self.log.exception("delivery_handling_failed", message_id=delivery.message_id)

        return handle

    def _run_claimed(self, claimed: ClaimedResponse) -> Callable[[Abort], Awaitable[None]]:
        async def run(abort: Abort) -> None:
            try:
                await self.executor.run_claimed(claimed, abort)
            except Exception:
                self.log.exception(
                    "claimed_task_handling_failed", task_id=str(claimed.task.task_id)
                )

        return run

    async def slot_or_stop(self, stop_wait: asyncio.Future[Any], timeout: float) -> bool:
        """Wait up to `timeout` for a slot to be freed (or the stop); False on the timeout."""
        self.freed.clear()
        freed = asyncio.ensure_future(self.freed.wait())
        try:
            done, _ = await asyncio.wait(
                {stop_wait, freed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            freed.cancel()
        return bool(done)

    async def gather_free_slots(self, free: int, stop_wait: asyncio.Future[Any]) -> int:
        """Under a backlog, let a few more running tasks finish (a short, bounded wait) so one
        claim-next call fills several slots; the free slots then."""
        enough = min(MAX_BATCH, self.concurrency)
        if free >= enough or not self.occupied:
            return free
        loop = asyncio.get_running_loop()
        until = loop.time() + CLAIM_AHEAD_GATHER_SECONDS
        while free < enough and self.occupied and not stop_wait.done():
            left = until - loop.time()
            if left <= 0:
                break
            await self.slot_or_stop(stop_wait, left)
            free = self.concurrency - self.occupied
        return free

    async def drain(self, timeout: float) -> None:
        if not self._running:
            return
        self.log.info("draining", running=len(self._running))
        _, pending = await asyncio.wait(set(self._running), timeout=timeout)
        if not pending:
            return
        self.log.warning("drain_timeout_stopping_tasks", stopping=len(pending))
        for task in pending:
            abort = self._running.get(task)
            if abort is not None:
                abort.trigger("draining", "the wrapper is shutting down")
        settings = self.drain_settings
        timeout = settings.kill_grace_seconds + settings.report_timeout_seconds
        _, stuck = await asyncio.wait(pending, timeout=timeout)
        for task in stuck:
            self.log.error("task_report_timed_out_at_shutdown")
            await cancel_and_wait(task)
