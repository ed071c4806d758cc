"""The wrapper's setup: wire the slots to one way of getting work, run it, drain on stop.

A wrapper gets work one of three ways, each in its own module: the SQS receive loop
(`receive_loop`), with claim-ahead under a backlog (`claim_ahead`, `claim_ahead` setting), or the
waiting claim kept open on the dispatcher beside the SQS long poll (`waiting_claim`,
`poll_dispatcher`, the default). The slots they share are in `slots`.

Invariants:
  * Exactly one way runs; it starts work only into free slots (`slots.WorkSlots`), so at most
    `concurrency` operators run at once.
  * The loop never dies of an error: a failing receive or claim is logged and retried.
  * On stop: no new receive or poll starts; the way's poll in flight is waited for and what it
    claimed runs; running tasks get `drain_timeout_seconds` to finish; the rest are stopped
    (process group killed) and reported Failed with `reason: Drained` and
    `retry_after_seconds: 0` (an attempt that does not count against the task's
    `max_attempts`), within the report timeout; messages a receive brings back after the stop,
    and messages still waiting for a slot, are released (visible again at once) for another
    worker. Then `run` returns.
  * Liveness (`health`, served as `/healthz`): the way moves the mark as each loop states; from
    the stop on, the wrapper reports `draining`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from taskplat.common.logging import get_logger
from taskplat.common.sqs import sqs_client, sqs_queue_name
from taskplat.common.telemetry import Telemetry
from taskplat.worker_wrapper.claim_ahead import ClaimAhead
from taskplat.worker_wrapper.claim_poll import ClaimPoll
from taskplat.worker_wrapper.dispatcher_client import DispatcherClient
from taskplat.worker_wrapper.execution import ExecutionSettings, TaskExecutor
from taskplat.worker_wrapper.intake import Delivery, SqsIntake
from taskplat.worker_wrapper.isolation import Isolation, OperatorIdentity
from taskplat.worker_wrapper.observability import IntakeHealth, WrapperTelemetry
from taskplat.worker_wrapper.operators import OperatorSpec
from taskplat.worker_wrapper.outcomes import OperatorRunner
from taskplat.worker_wrapper.pool import build_runners
from taskplat.worker_wrapper.protocol import StdoutLimits
from taskplat.worker_wrapper.receive_loop import ReceiveBackoff, ReceiveLoop, release_deliveries
from taskplat.worker_wrapper.runner import RunnerLimits
from taskplat.worker_wrapper.self_report import SelfReport
from taskplat.worker_wrapper.settings import WrapperSettings
from taskplat.worker_wrapper.slots import DrainSettings, WorkSlots
from taskplat.worker_wrapper.waiting_claim import WaitingClaimLoop

__all__ = ["DrainSettings", "IntakeSettings", "WorkerWrapper", "build_wrapper"]


@dataclass(frozen=True)
class IntakeSettings:
    claim_ahead: bool = False
    batch_calls: bool = False
    parallel_calls: int = 4
    claim_next_timeout_seconds: float = 10.0
    report_in_background: bool = False


class WayOfGettingWork(Protocol):
    async def run(
        self, stop: asyncio.Event, stop_wait: asyncio.Future[Any]
    ) -> asyncio.Future[list[Delivery]] | None:
        """Get work until the stop; the SQS receive still in flight then (None: none)."""

    async def drain_after_stop(self) -> None:
        """Drain the running tasks (and what a claim in flight at the stop brings)."""

    async def release_waiting(self) -> None:
        """Hand back the received deliveries that never got a slot."""


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
        settings = intake_settings or IntakeSettings()
        self.slots = WorkSlots(
            executor,
            concurrency=concurrency,
            drain=drain,
            report_in_background=settings.report_in_background,
            batch_calls=settings.batch_calls,
            parallel_calls=settings.parallel_calls,
        )
        self.health = IntakeHealth()
        backoff = ReceiveBackoff(
            self.health, retry_base_seconds=retry_base_seconds, retry_max_seconds=retry_max_seconds
        )
        self.way: WayOfGettingWork
        if poll is not None:
            self.way = WaitingClaimLoop(poll, intake, self.slots, self.health, backoff)
        else:
            claim_ahead = (
                ClaimAhead(
                    self.slots, claim_next_timeout_seconds=settings.claim_next_timeout_seconds
                )
                if settings.claim_ahead
                else None
            )
            self.way = ReceiveLoop(intake, self.slots, self.health, backoff, claim_ahead)
        self.log = get_logger()

    @property
    def running(self) -> int:
        return self.slots.running

    @property
    def reporting(self) -> int:
        """Tasks whose operator exited and whose outcome is being reported."""
        return self.slots.reporting

    async def run(self, stop: asyncio.Event) -> None:
        self.log.info(
            "worker_wrapper_started", queue=self.intake.queue_name, concurrency=self.concurrency
        )
        stop_wait = asyncio.ensure_future(stop.wait())
        abandoned: asyncio.Future[list[Delivery]] | None = None
        try:
            abandoned = await self.way.run(stop, stop_wait)
        finally:
            self.health.draining = True
            stop_wait.cancel()
            self.log.info("worker_wrapper_stopping", running=self.slots.running)
            await asyncio.gather(
                self.way.drain_after_stop(), self._hand_back(abandoned), self.way.release_waiting()
            )
            await self.intake.settle(self.drain.report_timeout_seconds)
            self.log.info("worker_wrapper_stopped")

    async def _hand_back(self, receive: asyncio.Future[list[Delivery]] | None) -> None:
        """Release the messages of a receive still in flight when the stop came."""
        if receive is None:
            return
        done, _ = await asyncio.wait({receive}, timeout=self.drain.receive_wait_seconds + 5)
        if not done or receive.cancelled() or receive.exception() is not None:
            return
        await release_deliveries(self.intake, receive.result())

    async def aclose(self) -> None:
        await asyncio.gather(*(runner.close() for runner in self.runners.values()))
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
    wrapper = WorkerWrapper(
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
    if (
        isinstance(wrapper.way, WaitingClaimLoop)
        and settings.claim_with_completions
        and settings.batch_calls
    ):
        # Under a backlog the completion batcher asks the waiting claim for a claim to carry.
        executor.completions.claim_along = wrapper.way.claim_along
    return wrapper
