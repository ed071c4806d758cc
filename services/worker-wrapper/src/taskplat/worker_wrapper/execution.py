"""One SQS delivery: parse, claim, then hand the claimed attempt to `attempt.RunningTask`.

Invariants:
  * A malformed body is poison: deleted at once (and logged), nothing else happens.
  * A delivery stopped before its claim is released (visible again at once), not claimed.
  * Operator code runs only after the dispatcher answered `Claimed`; `NotClaimed` deletes the
    message and runs nothing, except when a limit of the queue held the task back
    (`ConcurrencyLimited`, `KeyConcurrencyLimited`, `RateLimited`): the task is still Queued, so
    its message is kept, hidden for the answer's `retry_after_ms` (rounded up to whole seconds),
    and comes back then. Every claim answer is counted by result.
  * The message is deleted only after the dispatcher answered NotClaimed, accepted the completion
    (200), or rejected it as stale (409/404); after a NotClaimed or an accepted completion the
    deletion runs in the background (`delete_soon`), so it never holds a slot; a call that could
    not be made in time leaves the message for SQS to redeliver (the lease expires and the reaper
    retries the task).
  * Each wake-up with a valid body is one CONSUMER span `task.attempt` whose parent is the trace
    context of the SQS message; the claim, the operator run and the completion are its children
    (a claim made in a batch call is that call's span, not a child).
  * A delivery that is part of a `ClaimGroup` asks the group for its claim or withdraws from it,
    exactly once, whatever happens.
  * A task claimed ahead (`run_claimed`, no SQS message) runs and reports exactly like a claimed
    wake-up; it has no message to extend or delete. Its span `task.attempt` starts a new trace.
  * While a delivery is handled, `worker_id`, `queue`, `task_id` (then `attempt`, `operator`) are
    bound to every log line; each transition is one event: `task_claimed`, `operator_started`,
    `operator_killed`, `task_completed`/`task_failed`/`task_canceled`, `message_deleted`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from pydantic import ValidationError

from taskplat.common.contracts import ClaimedResponse, NotClaimedResponse, WakeUpMessage
from taskplat.common.contracts.internal import LIMITED_REASONS
from taskplat.common.logging import get_logger
from taskplat.common.telemetry import extract
from taskplat.worker_wrapper.attempt import RunningTask
from taskplat.worker_wrapper.batching import ClaimGroup, CompletionBatcher
from taskplat.worker_wrapper.dispatcher_client import (
    ClaimAnswer,
    DispatcherClient,
    DispatcherProtocolError,
    DispatcherUnavailable,
)
from taskplat.worker_wrapper.intake import Delivery, SqsIntake
from taskplat.worker_wrapper.observability import WrapperTelemetry
from taskplat.worker_wrapper.operators import OperatorSpec, summarize
from taskplat.worker_wrapper.outcomes import Abort, OperatorRunner

MAX_HIDDEN_SECONDS = 12 * 3600  # SQS's longest visibility timeout


def hidden_seconds(retry_after_ms: int | None) -> int:
    """How long a wake-up held back by a limit stays hidden: `retry_after_ms` in whole seconds,
    at least one."""
    millis = retry_after_ms if retry_after_ms is not None else 1000
    return min(MAX_HIDDEN_SECONDS, max(1, -(-millis // 1000)))


Claimer = Callable[[uuid.UUID, float], Awaitable[ClaimAnswer]]


@dataclass(frozen=True)
class ExecutionSettings:
    worker_id: str
    claim_retry_seconds: float
    complete_retry_min_seconds: float
    heartbeat_fraction: float
    heartbeat_min_interval_seconds: float
    visibility_extension_seconds: float
    retry_base_seconds: float
    retry_max_seconds: float
    batch_calls: bool = False
    parallel_calls: int = 4
    complete_linger_seconds: float = 0.0


class TaskExecutor:
    def __init__(
        self,
        client: DispatcherClient,
        intake: SqsIntake,
        runners: Mapping[str, OperatorRunner],
        specs: Mapping[str, OperatorSpec],
        settings: ExecutionSettings,
        telemetry: WrapperTelemetry | None = None,
    ) -> None:
        self.client = client
        self.intake = intake
        self.runners = runners
        self.specs = specs
        self.settings = settings
        self.telemetry = telemetry or WrapperTelemetry()
        self.completions = CompletionBatcher(
            client,
            parallel=settings.parallel_calls,
            enabled=settings.batch_calls,
            linger_seconds=settings.complete_linger_seconds,
        )
        self._claims_in_flight = 0
        self.wakeups_claimed = 0  # wake-ups whose claim answered Claimed, ever
        self.claims_settled = asyncio.Event()  # set while no claim of a wake-up is in flight
        self.claims_settled.set()

    async def handle(
        self, delivery: Delivery, abort: Abort, group: ClaimGroup | None = None
    ) -> None:
        asked = False

        async def claim(task_id: uuid.UUID, until: float) -> ClaimAnswer:
            nonlocal asked
            asked = True
            self._claims_in_flight += 1
            self.claims_settled.clear()
            try:
                if group is None:
                    return await self.client.claim(task_id, self.settings.worker_id, until=until)
                return await group.claim(task_id, until=until)
            finally:
                self._claims_in_flight -= 1
                if self._claims_in_flight == 0:
                    self.claims_settled.set()

        try:
            await self._handle(delivery, abort, claim)
        finally:
            if group is not None and not asked:
                group.withdraw()

    async def run_claimed(self, claimed: ClaimedResponse, abort: Abort) -> None:
        """Run a task claimed ahead (no SQS message)."""
        bound = {"worker_id": self.settings.worker_id, "queue": self.telemetry.queue}
        task = claimed.task
        attributes: dict[str, str | int] = {
            "taskplat.task_id": str(task.task_id),
            "taskplat.claim": "ahead",
            "taskplat.attempt": claimed.attempt,
            "taskplat.operator": task.operator,
        }
        with (
            structlog.contextvars.bound_contextvars(**bound, task_id=str(task.task_id)),
            self.telemetry.tracer.start_as_current_span(
                "task.attempt",
                context=extract(claimed.trace_context or {}),  # the create's trace
                kind=SpanKind.CONSUMER,
                attributes=attributes,
            ) as span,
        ):
            self.telemetry.claim("Claimed")
            await self._run(claimed, None, abort, span)

    async def _handle(self, delivery: Delivery, abort: Abort, claim: Claimer) -> None:
        bound = {"worker_id": self.settings.worker_id, "queue": self.telemetry.queue}
        with structlog.contextvars.bound_contextvars(**bound):
            try:
                wake = WakeUpMessage.model_validate_json(delivery.body)
            except ValidationError as exc:
                await self.intake.delete(
                    delivery, "poison", body=delivery.body[:200], error=summarize(exc)
                )
                return
            task_id = str(wake.task_id)
            attributes: dict[str, str | int] = {
                "messaging.system": "aws_sqs",
                "messaging.operation": "process",
                "messaging.destination.name": self.intake.queue_name,
                "messaging.message.id": delivery.message_id,
                "taskplat.task_id": task_id,
                "taskplat.receive_count": delivery.receive_count,
            }
            with (
                structlog.contextvars.bound_contextvars(task_id=task_id),
                self.telemetry.tracer.start_as_current_span(
                    "task.attempt",
                    context=extract(delivery.trace_context),
                    kind=SpanKind.CONSUMER,
                    attributes=attributes,
                ) as span,
            ):
                await self._claim_and_run(wake, delivery, abort, span, claim)

    async def _claim_and_run(
        self, wake: WakeUpMessage, delivery: Delivery, abort: Abort, span: Span, claim: Claimer
    ) -> None:
        log = get_logger()
        if abort.is_set:  # stopped before it was claimed: hand the message back
            span.set_attribute("taskplat.result", "released")
            await self.intake.release(delivery)
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + self.settings.claim_retry_seconds
        try:
            answer = await claim(wake.task_id, until)
        except (DispatcherUnavailable, DispatcherProtocolError) as exc:
            log.error("claim_failed_message_left", error=str(exc))
            span.set_status(Status(StatusCode.ERROR, "claim failed"))
            return
        if isinstance(answer, NotClaimedResponse):
            self.telemetry.claim(answer.reason)
            span.set_attribute("taskplat.result", f"NotClaimed:{answer.reason}")
            log.info("not_claimed", reason=answer.reason, retry_after_ms=answer.retry_after_ms)
            if answer.reason in LIMITED_REASONS:  # still Queued: its wake-up must come back
                self.intake.hide_soon(delivery, hidden_seconds(answer.retry_after_ms))
                return
            # in the background: the slot is free at once, not after the deletion's batch
            self.intake.delete_soon(delivery, "not_claimed", reason=answer.reason)
            return
        self.telemetry.claim("Claimed")
        self.wakeups_claimed += 1
        span.set_attribute("taskplat.attempt", answer.attempt)
        span.set_attribute("taskplat.operator", answer.task.operator)
        await self._run(answer, delivery, abort, span)

    async def _run(
        self, answer: ClaimedResponse, delivery: Delivery | None, abort: Abort, span: Span
    ) -> None:
        task = answer.task
        with structlog.contextvars.bound_contextvars(
            attempt=answer.attempt, operator=task.operator, queue=task.queue
        ):
            get_logger().info(
                "task_claimed",
                lease_expires_at=answer.lease_expires_at.isoformat(),
                deadline_at=task.deadline_at.isoformat() if task.deadline_at else None,
                message_id=delivery.message_id if delivery is not None else None,
            )
            outcome = await RunningTask(self, delivery, answer, abort).run()
        span.set_attribute("taskplat.result", outcome)
        if outcome != "Completed":
            span.set_status(Status(StatusCode.ERROR, outcome))
