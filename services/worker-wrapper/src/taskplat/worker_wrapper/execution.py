"""One SQS delivery, end to end: parse, claim, run the operator, heartbeat, complete, delete.

Invariants:
  * A malformed body is poison: deleted at once (and logged), nothing else happens.
  * A delivery stopped before its claim is released (visible again at once), not claimed.
  * Operator code runs only after the dispatcher answered `Claimed`; `NotClaimed` deletes the
    message and runs nothing.
  * The message is deleted only after the dispatcher answered NotClaimed, accepted the completion
    (200), or rejected it as stale (409/404); a call that could not be made in time leaves the
    message for SQS to redeliver (the lease expires and the reaper retries the task).
  * While the task runs, heartbeats renew the lease (a fraction of the time it has left, with a
    floor) and the message's visibility is renewed; both run until the completion was answered.
  * A rejected heartbeat or event call stops the operator: `Canceled` is reported as a Canceled
    completion; any other rejection (the attempt or lease is no longer current) reports nothing.
  * Events are forwarded in the order the operator wrote them; once one batch could not be
    delivered, that batch and every later one travel as final events of the completion.
  * The hard deadline is the dispatcher's `deadline_at`, or the operator's `timeout_seconds` from
    the claim when the task set no timeout and that is sooner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from pydantic import ValidationError

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.contracts import (
    ClaimedResponse,
    CompleteRequest,
    Event,
    EventsRequest,
    HeartbeatRequest,
    NotClaimedResponse,
    WakeUpMessage,
)
from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.dispatcher_client import (
    DispatcherClient,
    DispatcherProtocolError,
    DispatcherUnavailable,
    Rejection,
)
from taskplat.worker_wrapper.intake import Delivery, SqsIntake
from taskplat.worker_wrapper.operators import OperatorSpec, summarize
from taskplat.worker_wrapper.outcomes import (
    Abort,
    Failed,
    OperatorRunner,
    RunOutcome,
    Stopped,
    Succeeded,
    TaskInput,
    failure,
)

EVENTS_PER_CALL = 1000
DRAIN_MESSAGE = "worker shutting down: operator stopped after the drain timeout"


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


def loop_time_of(instant: datetime) -> float:
    """An absolute time as event-loop time (the worker's clock against the dispatcher's)."""
    loop = asyncio.get_running_loop()
    return loop.time() + (instant - datetime.now(UTC)).total_seconds()


def effective_deadline(
    claimed: ClaimedResponse, spec: OperatorSpec | None, claimed_at: datetime
) -> datetime | None:
    deadline = claimed.task.deadline_at
    if (
        spec is not None
        and spec.timeout_seconds is not None
        and claimed.task.timeout_seconds is None
    ):
        operator_deadline = claimed_at + timedelta(seconds=spec.timeout_seconds)
        deadline = operator_deadline if deadline is None else min(deadline, operator_deadline)
    return deadline


class TaskExecutor:
    def __init__(
        self,
        client: DispatcherClient,
        intake: SqsIntake,
        runners: Mapping[str, OperatorRunner],
        specs: Mapping[str, OperatorSpec],
        settings: ExecutionSettings,
    ) -> None:
        self.client = client
        self.intake = intake
        self.runners = runners
        self.specs = specs
        self.settings = settings

    async def handle(self, delivery: Delivery, abort: Abort) -> None:
        log = get_logger()
        try:
            wake = WakeUpMessage.model_validate_json(delivery.body)
        except ValidationError as exc:
            log.warning(
                "poison_message_deleted",
                message_id=delivery.message_id,
                body=delivery.body[:200],
                error=summarize(exc),
            )
            await self.intake.delete(delivery)
            return
        with structlog.contextvars.bound_contextvars(task_id=str(wake.task_id)):
            if abort.is_set:  # stopped before it was claimed: hand the message back
                await self.intake.release(delivery)
                return
            loop = asyncio.get_running_loop()
            until = loop.time() + self.settings.claim_retry_seconds
            try:
                answer = await self.client.claim(wake.task_id, self.settings.worker_id, until=until)
            except (DispatcherUnavailable, DispatcherProtocolError) as exc:
                log.error("claim_failed_message_left", error=str(exc))
                return
            if isinstance(answer, NotClaimedResponse):
                log.info("not_claimed", reason=answer.reason)
                await self.intake.delete(delivery)
                return
            with structlog.contextvars.bound_contextvars(attempt=answer.attempt):
                await RunningTask(self, delivery, answer, abort).run()


class RunningTask:
    """A claimed attempt: runs the operator while heartbeating, then reports the outcome."""

    def __init__(
        self, executor: TaskExecutor, delivery: Delivery, claimed: ClaimedResponse, abort: Abort
    ) -> None:
        self.x = executor
        self.delivery = delivery
        self.claimed = claimed
        self.abort = abort
        self.lease_expires = loop_time_of(claimed.lease_expires_at)
        self.deferred_events: list[Event] = []
        self.reporting = False
        self.log = get_logger()

    @property
    def task_id(self) -> str:
        return str(self.claimed.task.task_id)

    async def run(self) -> None:
        heartbeats = asyncio.ensure_future(self._heartbeat_loop())
        visibility = asyncio.ensure_future(self._visibility_loop())
        try:
            outcome = await self._run_operator()
            await self._report(outcome)
        finally:
            for task in (heartbeats, visibility):
                task.cancel()
            await asyncio.gather(heartbeats, visibility, return_exceptions=True)

    # ---- the operator -------------------------------------------------------------------

    async def _run_operator(self) -> RunOutcome:
        task = self.claimed.task
        runner = self.x.runners.get(task.operator)
        if runner is None:
            return failure(
                f"unknown operator {task.operator!r} on worker {self.x.settings.worker_id}"
            )
        deadline = effective_deadline(
            self.claimed, self.x.specs.get(task.operator), datetime.now(UTC)
        )
        document = task.model_dump(mode="json")
        document["lease_token"] = str(self.claimed.lease_token)
        document["deadline_at"] = deadline.isoformat() if deadline is not None else None
        env = {
            "TASKPLAT_TASK_ID": str(task.task_id),
            "TASKPLAT_ATTEMPT": str(self.claimed.attempt),
            "TASKPLAT_LEASE_TOKEN": str(self.claimed.lease_token),
            "TASKPLAT_DEADLINE_AT": deadline.isoformat() if deadline is not None else "",
        }
        self.log.info("operator_starting", operator=task.operator, deadline_at=str(deadline))
        return await runner.run(
            TaskInput(document, env),
            deadline=loop_time_of(deadline) if deadline is not None else None,
            forward=self._forward,
            abort=self.abort,
        )

    async def _forward(self, events: Sequence[Event]) -> None:
        for start in range(0, len(events), EVENTS_PER_CALL):
            batch = list(events[start : start + EVENTS_PER_CALL])
            if self.deferred_events or self.abort.is_set:
                self.deferred_events.extend(batch)
                continue
            body = EventsRequest(
                task_id=self.claimed.task.task_id,
                attempt=self.claimed.attempt,
                lease_token=self.claimed.lease_token,
                events=batch,
            )
            try:
                answer = await self.x.client.events(body, until=self._call_bound())
            except (DispatcherUnavailable, DispatcherProtocolError) as exc:
                self.log.warning("events_deferred_to_completion", error=str(exc), count=len(batch))
                self.deferred_events.extend(batch)
                continue
            if isinstance(answer, Rejection):
                self._rejected("events", answer)

    # ---- lease and visibility -----------------------------------------------------------

    def _call_bound(self) -> float:
        """Calls for this attempt are retried until its lease expires (and at least a while)."""
        loop = asyncio.get_running_loop()
        return max(self.lease_expires, loop.time() + self.x.settings.complete_retry_min_seconds)

    def _rejected(self, call: str, rejection: Rejection) -> None:
        if self.reporting:
            return
        if rejection.reason == "Canceled":
            stopped = self.abort.trigger("canceled", "the task was canceled")
        else:
            detail = f"{call} rejected: {rejection.reason}"
            stopped = self.abort.trigger("lease_lost", detail)
        if stopped:
            self.log.warning(
                "attempt_no_longer_current",
                call=call,
                reason=rejection.reason,
                message=rejection.message,
            )

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        settings = self.x.settings
        failures = 0
        while True:
            interval = max(
                settings.heartbeat_min_interval_seconds,
                (self.lease_expires - loop.time()) * settings.heartbeat_fraction,
            )
            if failures:
                retry = full_jitter_delay(
                    settings.retry_base_seconds, settings.retry_max_seconds, failures
                )
                interval = max(settings.heartbeat_min_interval_seconds, min(retry, interval))
            await asyncio.sleep(interval)
            body = HeartbeatRequest(
                task_id=self.claimed.task.task_id,
                attempt=self.claimed.attempt,
                lease_token=self.claimed.lease_token,
            )
            try:
                answer = await self.x.client.heartbeat(body, until=loop.time())
            except (DispatcherUnavailable, DispatcherProtocolError) as exc:
                failures += 1
                self.log.warning("heartbeat_failed", error=str(exc), failures=failures)
                continue
            failures = 0
            if isinstance(answer, Rejection):
                self._rejected("heartbeat", answer)
                return
            self.lease_expires = loop_time_of(answer.lease_expires_at)

    async def _visibility_loop(self) -> None:
        while True:
            await asyncio.sleep(self.x.settings.visibility_extension_seconds)
            await self.x.intake.extend(self.delivery)

    # ---- the report ---------------------------------------------------------------------

    def _completion(self, outcome: RunOutcome) -> CompleteRequest | None:
        base = {
            "task_id": self.claimed.task.task_id,
            "attempt": self.claimed.attempt,
            "lease_token": self.claimed.lease_token,
        }
        if isinstance(outcome, Succeeded):
            return CompleteRequest(
                **base,
                status="Completed",
                result=outcome.payload,
                outputs=list(outcome.outputs),
                events=[*self.deferred_events, *outcome.events],
            )
        if isinstance(outcome, Failed):
            return CompleteRequest(
                **base,
                status="Failed",
                error_message=outcome.error_message,
                events=self.deferred_events,
            )
        if outcome.reason == "canceled":
            return CompleteRequest(**base, status="Canceled")
        if outcome.reason == "draining":
            return CompleteRequest(
                **base,
                status="Failed",
                error_message=DRAIN_MESSAGE,
                retry_after_seconds=0,
                events=self.deferred_events,
            )
        return None  # the lease is lost: this attempt reports nothing

    async def _report(self, outcome: RunOutcome) -> None:
        self.reporting = True
        request = self._completion(outcome)
        if request is None:
            assert isinstance(outcome, Stopped)
            self.log.warning("attempt_abandoned", detail=outcome.detail)
            await self.x.intake.delete(self.delivery)
            return
        if request.status == "Failed":
            self.log.info(
                "attempt_failed",
                error=request.error_message[:500] if request.error_message else None,
            )
        try:
            answer = await self.x.client.complete(request, until=self._call_bound())
        except DispatcherUnavailable as exc:
            self.log.error("completion_not_reported_message_left", error=str(exc))
            return
        except DispatcherProtocolError as exc:
            if exc.status_code not in (413, 422) or request.status != "Completed":
                self.log.error("completion_refused_message_left", error=str(exc))
                return
            # The dispatcher refused the result itself (too large, invalid): fail the attempt.
            self.log.warning("completion_refused_reporting_failure", error=str(exc))
            await self._report(failure(f"the dispatcher refused the result: {exc.body}"))
            return
        if isinstance(answer, Rejection):
            self.log.warning("completion_rejected", reason=answer.reason, message=answer.message)
        else:
            self.log.info(
                "task_reported",
                status=request.status,
                task_status=answer.task_status,
                repeated=answer.repeated,
            )
        await self.x.intake.delete(self.delivery)
