"""The wrapper's main loop: receive wake-ups while slots are free, run them, drain on stop.

Invariants:
  * A slot holds one delivery or task claimed ahead from its receive or claim until its operator
    exits; with `report_in_background` the outcome is then reported (the lease kept) while the
    slot runs the next task, and only the reports beyond `concurrency` still hold a slot. So at
    most `concurrency` operators run, and at most 2 x `concurrency` tasks are handled, at once. A
    receive asks for no more messages than there are free slots (and at most 10).
  * The deliveries of one receive claim with one batch call when there are more of them than
    `parallel_calls` (with `batch_calls`), else with one claim call each.
  * Claim-ahead (`claim_ahead`) is only an accelerator under a backlog: after a receive for two or
    more messages came back full and claimed at least one of its tasks, free slots are filled
    with `task-claim-next` (oldest Queued tasks of the queue; the loop waits at most
    `CLAIM_AHEAD_GATHER_SECONDS` for every slot (at most 10) to be free, so one call fills them
    all) for as long as it comes back full; then the wrapper long-polls SQS again. A claim-next
    waits until every claim of a received wake-up was answered, so it never takes a task whose
    own wake-up this wrapper is claiming. An idle wrapper always long-polls, so the wake-up
    guarantee does not depend on claim-ahead. A failed claim-next is logged and only ends the
    backlog.
  * With a waiting claim (`poll`, the default), the wrapper keeps one `task-claim-next` with
    `wait_seconds` open on the dispatcher while slots are free (`claim_poll`): it reserves the
    slots it asked for, and brings a task of the queue as soon as one becomes Queued. SQS is
    long-polled beside it, for the wake-ups the dispatcher's NOTIFY did not cover (a lost NOTIFY,
    a poll that failed); an idle wrapper's poll leaves one free slot to what SQS brings (unless
    it has only one), and a message that arrives while the poll holds every free slot waits for
    a slot (its visibility renewed as usual) before any new poll starts. Under a backlog (the
    last poll came back full, two or more tasks) the loop gathers free slots as claim-ahead does,
    so one call fills them all; claim-ahead itself is not used.
  * A failing receive (SQS down, queue missing) is logged and retried with backoff; the loop never
    dies of an error, and the handling of one delivery never breaks another.
  * On stop: no new receive or poll starts; the poll in flight is waited for and what it claimed
    runs (it is leased to this wrapper); messages still waiting for a slot are released; running
    tasks get `drain_timeout_seconds` to finish; the rest
    are stopped (process group killed) and reported Failed with `reason: Drained` and
    `retry_after_seconds: 0` (an attempt that does not count against the task's `max_attempts`),
    within the report timeout; messages a receive brings back after the stop are released
    (visible again at once) for another worker. Then `run` returns.
  * Liveness (`health`, served as `/healthz`): the mark moves each time a receive poll returned,
    and each time a saturated wrapper's wait for a free slot timed out (at most
    `wait_time_seconds` apart, as a poll); a failing receive does not move it. From the stop on,
    the wrapper reports `draining`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.contracts import ClaimedResponse
from taskplat.common.contracts.internal import MAX_BATCH
from taskplat.common.logging import get_logger
from taskplat.common.sqs import sqs_client, sqs_queue_name
from taskplat.common.telemetry import Telemetry
from taskplat.worker_wrapper.batching import ClaimGroup
from taskplat.worker_wrapper.claim_poll import ClaimPoll
from taskplat.worker_wrapper.dispatcher_client import (
    DispatcherClient,
    DispatcherProtocolError,
    DispatcherUnavailable,
)
from taskplat.worker_wrapper.execution import ExecutionSettings, TaskExecutor
from taskplat.worker_wrapper.intake import Delivery, SqsIntake
from taskplat.worker_wrapper.isolation import Isolation, OperatorIdentity
from taskplat.worker_wrapper.observability import IntakeHealth, WrapperTelemetry
from taskplat.worker_wrapper.operators import OperatorSpec
from taskplat.worker_wrapper.outcomes import Abort, OperatorRunner
from taskplat.worker_wrapper.pool import build_runners
from taskplat.worker_wrapper.protocol import StdoutLimits
from taskplat.worker_wrapper.racing import cancel_and_wait
from taskplat.worker_wrapper.runner import RunnerLimits
from taskplat.worker_wrapper.self_report import SelfReport
from taskplat.worker_wrapper.settings import WrapperSettings

# Under a backlog, how long the loop may wait for more slots to free up before one claim-next.
CLAIM_AHEAD_GATHER_SECONDS = 0.02


@dataclass(frozen=True)
class DrainSettings:
    drain_timeout_seconds: float
    report_timeout_seconds: float
    kill_grace_seconds: float
    receive_wait_seconds: float


@dataclass(frozen=True)
class IntakeSettings:
    claim_ahead: bool = False
    batch_calls: bool = False
    parallel_calls: int = 4
    claim_next_timeout_seconds: float = 10.0
    report_in_background: bool = False


class WorkerWrapper:
    def __init__(
        self,
        intake: SqsIntake,
        executor: TaskExecutor,
        runners: Mapping[str, OperatorRunner],
        *,
        concurrency: int,
        drain: DrainSettings,
        retry_base_seconds: float,
        retry_max_seconds: float,
        intake_settings: IntakeSettings | None = None,
        poll: ClaimPoll | None = None,
    ) -> None:
        self.intake = intake
        self.executor = executor
        self.runners = runners
        self.concurrency = concurrency
        self.drain = drain
        self._retry_base = retry_base_seconds
        self._retry_max = retry_max_seconds
        self._running: dict[asyncio.Future[None], Abort] = {}  # every task handled
        self._reporting: set[asyncio.Future[None]] = set()  # operator exited, reporting
        self._slot_freed = asyncio.Event()
        self._settings = intake_settings or IntakeSettings()
        self._backlog = False
        self._poll = poll
        self._waiting: list[Delivery] = []  # received while the poll held every free slot
        # The executor's count of claimed wake-ups before the receive that found a backlog.
        self._claimed_before_receive: int | None = None
        executor.completions.busy = lambda: len(self._running)
        self.health = IntakeHealth()
        self.log = get_logger()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def reporting(self) -> int:
        """Tasks whose operator exited and whose outcome is being reported."""
        return len(self._reporting)

    @property
    def _occupied(self) -> int:
        """Slots in use: tasks before their operator exited, and reports beyond `concurrency`."""
        reporting = len(self._reporting)
        return len(self._running) - reporting + max(0, reporting - self.concurrency)

    @property
    def _busy_tick(self) -> float:
        return max(1.0, self.drain.receive_wait_seconds)

    async def run(self, stop: asyncio.Event) -> None:
        self.log.info(
            "worker_wrapper_started", queue=self.intake.queue_name, concurrency=self.concurrency
        )
        stop_wait = asyncio.ensure_future(stop.wait())
        abandoned: asyncio.Future[list[Delivery]] | None = None
        try:
            if self._poll is None:
                abandoned = await self._receive_loop(stop, stop_wait)
            else:
                abandoned = await self._poll_loop(self._poll, stop, stop_wait)
        finally:
            self.health.draining = True
            stop_wait.cancel()
            self.log.info("worker_wrapper_stopping", running=len(self._running))
            await asyncio.gather(
                self._drain_after_poll(), self._hand_back(abandoned), self._release_waiting()
            )
            await self.intake.settle(self.drain.report_timeout_seconds)
            self.log.info("worker_wrapper_stopped")

    async def _receive_loop(
        self, stop: asyncio.Event, stop_wait: asyncio.Future[Any]
    ) -> asyncio.Future[list[Delivery]] | None:
        """Long-poll SQS while slots are free (claiming ahead under a backlog); the receive
        still in flight when the stop came."""
        failures = 0
        while not stop.is_set():
            free = self.concurrency - self._occupied
            if free <= 0:
                if not await self._slot_or_stop(stop_wait, self._busy_tick):
                    self.health.polled()  # saturated, yet the loop turns: that is progress
                continue
            if self._backlog:
                free = await self._gather_free_slots(free, stop_wait)
                if await self._claim_ahead(free):
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
                await asyncio.wait({stop_wait}, timeout=self._receive_failed(exc, failures))
                continue
            self.health.polled()
            failures = 0
            claimed_before = self.executor.wakeups_claimed
            self._start_all(deliveries)
            # A backlog: a receive for two or more messages came back full (and, once its
            # claims are answered, claimed something: see `_claim_ahead`).
            full = len(deliveries) >= max(wanted, 2)
            self._backlog = self._settings.claim_ahead and full
            self._claimed_before_receive = claimed_before if self._backlog else None
        return None

    async def _poll_loop(
        self, poll: ClaimPoll, stop: asyncio.Event, stop_wait: asyncio.Future[Any]
    ) -> asyncio.Future[list[Delivery]] | None:
        """Keep one waiting claim-next open on the dispatcher while slots are free, and long-poll
        SQS beside it; the receive still in flight when the stop came."""
        loop = asyncio.get_running_loop()
        receive: asyncio.Future[list[Delivery]] | None = None
        receive_failures = 0
        receive_at = 0.0  # event-loop time before which no receive starts (a backoff)
        while not stop.is_set():
            self._slot_freed.clear()
            self._start_waiting()
            room = self.concurrency - self._occupied - poll.reserved
            if poll.future is None and room > 0 and not self._waiting and not poll.delay():
                if self._backlog:  # the last poll came back full: let a few more slots free up
                    room = await self._gather_free_slots(room, stop_wait)
                    if stop_wait.done():
                        break
                    limit = min(room, MAX_BATCH)
                else:  # it may wait long: one slot stays free for a wake-up SQS brings meanwhile
                    limit = min(room - 1 if room > 1 else room, MAX_BATCH)
                poll.start(limit)
                room = self.concurrency - self._occupied - poll.reserved
            if receive is None and not self._waiting and loop.time() >= receive_at:
                if room > 0 or poll.future is not None:
                    # Beside a poll holding every free slot, one message: it waits for a slot.
                    receive = asyncio.ensure_future(
                        self.intake.receive(max(1, min(room, MAX_BATCH)))
                    )
            saturated = receive is None and poll.future is None and room <= 0
            waits: set[asyncio.Future[Any]] = {stop_wait}
            waits.update(each for each in (receive, poll.future) if each is not None)
            freed = asyncio.ensure_future(self._slot_freed.wait())
            timeout = self._busy_tick
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
                for each in claimed:
                    self._track(self._run_claimed(each))
                self._backlog = len(claimed) >= max(asked, 2)
            if receive is not None and receive.done():
                finished, receive = receive, None
                try:
                    deliveries = finished.result()
                except Exception as exc:
                    receive_failures += 1
                    receive_at = loop.time() + self._receive_failed(exc, receive_failures)
                    continue
                self.health.polled()
                receive_failures = 0
                self._waiting.extend(deliveries)
                self._start_waiting()
        return receive

    def _receive_failed(self, exc: Exception, failures: int) -> float:
        """Log a failed receive (the `failures`-th in a row); the backoff before the next."""
        self.health.poll_failed()
        self.log.warning("sqs_receive_failed", error=str(exc), failures=failures)
        delay = full_jitter_delay(self._retry_base, self._retry_max, failures)
        return max(delay, self._retry_base)

    def _start_waiting(self) -> None:
        """Start the received deliveries that have a slot (the poll's reservation aside)."""
        if not self._waiting:
            return
        reserved = self._poll.reserved if self._poll is not None else 0
        room = max(0, self.concurrency - self._occupied - reserved)
        ready, self._waiting = self._waiting[:room], self._waiting[room:]
        if ready:
            self._start_all(ready)

    async def _drain_after_poll(self) -> None:
        """Drain every running task, with what the poll in flight at the stop claims (it is
        leased to this wrapper): all within `drain_timeout_seconds` of the stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain.drain_timeout_seconds
        settle = asyncio.ensure_future(self._poll.settle()) if self._poll is not None else None
        await self._drain(self.drain.drain_timeout_seconds)  # the tasks running at the stop
        if settle is not None:
            for each in await settle:
                self._track(self._run_claimed(each))
            await self._drain(max(0.0, deadline - loop.time()))

    async def _release_waiting(self) -> None:
        """Hand back the deliveries that never got a slot (visible again at once)."""
        waiting, self._waiting = self._waiting, []
        for delivery in waiting:
            await self.intake.release(delivery)
            self.log.info("message_released_at_shutdown", message_id=delivery.message_id)

    def _start_all(self, deliveries: list[Delivery]) -> None:
        group = None
        if self._settings.batch_calls and len(deliveries) > self._settings.parallel_calls:
            group = ClaimGroup(
                self.executor.client, self.executor.settings.worker_id, len(deliveries)
            )
        for delivery in deliveries:
            self._track(self._handle(delivery, group))

    def _track(self, work: Callable[[Abort], Awaitable[None]]) -> None:
        abort = Abort()
        task = asyncio.ensure_future(work(abort))
        self._running[task] = abort
        if self._settings.report_in_background:
            abort.when_operator_exits(lambda: self._reports(task))
        task.add_done_callback(self._untrack)

    def _reports(self, task: asyncio.Future[None]) -> None:
        if task in self._running:
            self._reporting.add(task)
            self._slot_freed.set()

    def _untrack(self, task: asyncio.Future[None]) -> None:
        self._running.pop(task, None)
        self._reporting.discard(task)
        self._slot_freed.set()

    async def _slot_or_stop(self, stop_wait: asyncio.Future[Any], timeout: float) -> bool:
        """Wait up to `timeout` for a slot to be freed (or the stop); False on the timeout."""
        self._slot_freed.clear()
        freed = asyncio.ensure_future(self._slot_freed.wait())
        try:
            done, _ = await asyncio.wait(
                {stop_wait, freed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            freed.cancel()
        return bool(done)

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

    async def _gather_free_slots(self, free: int, stop_wait: asyncio.Future[Any]) -> int:
        """Under a backlog, let a few more running tasks finish (a short, bounded wait) so one
        claim-next call fills several slots; the free slots then."""
        enough = min(MAX_BATCH, self.concurrency)
        if free >= enough or not self._occupied:
            return free
        loop = asyncio.get_running_loop()
        until = loop.time() + CLAIM_AHEAD_GATHER_SECONDS
        while free < enough and self._occupied and not stop_wait.done():
            left = until - loop.time()
            if left <= 0:
                break
            await self._slot_or_stop(stop_wait, left)
            free = self.concurrency - self._occupied
        return free

    async def _claim_ahead(self, free: int) -> bool:
        """Fill free slots from the dispatcher; False when that claimed nothing."""
        await self.executor.claims_settled.wait()
        before, self._claimed_before_receive = self._claimed_before_receive, None
        if before is not None and self.executor.wakeups_claimed == before:
            # Every wake-up of that full receive was stale (its task claimed ahead, finished):
            # no sign of Queued tasks, so long-poll again instead of asking for them.
            self._backlog = False
            return False
        limit = min(free, MAX_BATCH)
        until = asyncio.get_running_loop().time() + self._settings.claim_next_timeout_seconds
        try:
            claimed = await self.executor.client.claim_next(
                self.executor.telemetry.queue, self.executor.settings.worker_id, limit, until=until
            )
        except (DispatcherUnavailable, DispatcherProtocolError) as exc:
            self.log.warning("claim_ahead_failed", error=str(exc))
            claimed = []
        for each in claimed:
            self._track(self._run_claimed(each))
        self._backlog = len(claimed) >= limit
        return bool(claimed)

    async def _drain(self, timeout: float) -> None:
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
        timeout = self.drain.kill_grace_seconds + self.drain.report_timeout_seconds
        _, stuck = await asyncio.wait(pending, timeout=timeout)
        for task in stuck:
            self.log.error("task_report_timed_out_at_shutdown")
            await cancel_and_wait(task)

    async def _hand_back(self, receive: asyncio.Future[list[Delivery]] | None) -> None:
        """Release the messages of a receive still in flight when the stop came."""
        if receive is None:
            return
        done, _ = await asyncio.wait({receive}, timeout=self.drain.receive_wait_seconds + 5)
        if not done or receive.cancelled() or receive.exception() is not None:
            return
        for delivery in receive.result():
            await self.intake.release(delivery)
            self.log.info("message_released_at_shutdown", message_id=delivery.message_id)

    async def aclose(self) -> None:
        for runner in self.runners.values():
            await runner.close()
        await self.executor.client.aclose()
        self.intake.close()


def build_wrapper(
    settings: WrapperSettings,
    specs: Mapping[str, OperatorSpec],
    environ: Mapping[str, str] | None = None,
    telemetry: Telemetry | None = None,
    aws: Any = None,
) -> WorkerWrapper:
    """Wire a wrapper from its settings and operator specs (`environ` feeds the allow-lists);
    it records into `telemetry` (None: records and traces nothing); `aws` is the boto3 session of
    its SQS client (None: a default one)."""
    instruments = WrapperTelemetry(telemetry, queue=settings.queue)
    limits = RunnerLimits(
        stdout=StdoutLimits(settings.stdout_line_max_bytes, settings.stdout_max_bytes),
        stderr_tail_bytes=settings.stderr_tail_bytes,
        kill_grace_seconds=settings.kill_grace_seconds,
    )
    isolation = Isolation(
        OperatorIdentity.detect(settings.operator_user), Path(settings.scratch_dir)
    )
    if isolation.identity is None and any(spec.untrusted for spec in specs.values()):
        get_logger().warning(
            "untrusted_operators_run_as_wrapper_user",
            reason="the wrapper cannot switch to the operator user",
            operator_user=settings.operator_user,
        )
    runners = build_runners(
        specs, limits, dict(os.environ if environ is None else environ), instruments, isolation
    )
    client = DispatcherClient(
        settings.dispatcher_url,
        settings.worker_token,
        timeout_seconds=settings.http_timeout_seconds,
        connect_timeout_seconds=settings.http_connect_timeout_seconds,
        retry_base_seconds=settings.retry_base_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        telemetry=instruments,
        report=SelfReport(
            settings.worker_id,
            settings.queue,
            settings.concurrency,
            interval_seconds=settings.report_interval_seconds,
        ),
    )
    intake = SqsIntake(
        sqs_client(settings, max_pool_connections=settings.concurrency + 4, session=aws),
        sqs_queue_name(settings, settings.queue),
        wait_time_seconds=settings.wait_time_seconds,
        visibility_timeout_seconds=settings.visibility_timeout_seconds,
        receive_visibility_seconds=settings.receive_visibility_timeout_seconds,
        delete_linger_seconds=settings.delete_linger_seconds,
        threads=settings.concurrency + 2,
        telemetry=instruments,
        batch_deletes=settings.batch_calls,
        parallel_deletes=settings.parallel_calls,
    )
    executor = TaskExecutor(
        client,
        intake,
        runners,
        specs,
        ExecutionSettings(
            worker_id=settings.worker_id,
            claim_retry_seconds=settings.claim_retry_seconds,
            complete_retry_min_seconds=settings.complete_retry_min_seconds,
            heartbeat_fraction=settings.heartbeat_fraction,
            heartbeat_min_interval_seconds=settings.heartbeat_min_interval_seconds,
            visibility_extension_seconds=settings.visibility_extension_seconds,
            retry_base_seconds=settings.retry_base_seconds,
            retry_max_seconds=settings.retry_max_seconds,
            batch_calls=settings.batch_calls,
            parallel_calls=settings.parallel_calls,
            complete_linger_seconds=settings.complete_linger_seconds,
        ),
        instruments,
    )
    return WorkerWrapper(
        intake,
        executor,
        runners,
        concurrency=settings.concurrency,
        drain=DrainSettings(
            drain_timeout_seconds=settings.drain_timeout_seconds,
            report_timeout_seconds=settings.shutdown_report_timeout_seconds,
            kill_grace_seconds=settings.kill_grace_seconds,
            receive_wait_seconds=settings.wait_time_seconds,
        ),
        retry_base_seconds=settings.retry_base_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        poll=(
            ClaimPoll(
                client,
                settings.queue,
                settings.worker_id,
                wait_seconds=settings.poll_wait_seconds,
                timeout_seconds=settings.http_timeout_seconds,
                retry_base_seconds=settings.retry_base_seconds,
                retry_max_seconds=settings.retry_max_seconds,
            )
            if settings.poll_dispatcher
            else None
        ),
        intake_settings=IntakeSettings(
            claim_ahead=settings.claim_ahead,
            batch_calls=settings.batch_calls,
            parallel_calls=settings.parallel_calls,
            claim_next_timeout_seconds=settings.http_timeout_seconds,
            report_in_background=settings.report_in_background,
        ),
    )
