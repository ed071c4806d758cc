"""A claimed attempt: run the operator while heartbeating, then report the outcome.

Invariants:
  * While the task runs, heartbeats renew the lease (a fraction of the time it has left, with a
    floor) and the message's visibility is renewed (the intake renewed it to the full timeout
    early, see `intake`); both run until the completion was answered.
    A task claimed ahead has no message: nothing to renew, nothing to delete.
  * A rejected heartbeat or event call stops the operator: `Canceled` is reported as a Canceled
    completion; any other rejection (the attempt or lease is no longer current) reports nothing.
  * Events are forwarded in the order the operator wrote them; once one batch could not be
    delivered, that batch and every later one travel as final events of the completion.
  * Step results are recorded (`/internal/steps`) in the same order, as they are written.
  * Records for buffered outputs (`publishing`) are all in their buffer queues before a success
    is reported; a record that cannot be published fails the attempt instead.
  * The hard deadline is the dispatcher's `deadline_at`, or the operator's `timeout_seconds` from
    the claim when the task set no timeout and that is sooner.
  * The operator runs inside the `operator.run` span and continues the trace from it:
    `TRACEPARENT` (and `TRACESTATE`) in its environment in per-task mode, `traceparent` (and
    `tracestate`) in its task line in pooled mode. Nothing is added when tracing is off.
  * Once the operator has exited (and its records are published), the wrapper is told
    (`Abort.operator_exited`) before the outcome is reported: the slot may take the next task
    while this attempt's report, heartbeats and visibility renewals go on.
  * Each attempt counts once in `taskplat.worker.tasks` and `taskplat.operator.run_time` with how
    it ended (see `observability`), and is counted busy while it runs; an accepted completion is
    logged `task_completed`, `task_failed` or `task_canceled`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, Status, StatusCode

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.contracts import (
    ClaimedResponse,
    CompleteRequest,
    Event,
    EventsRequest,
    HeartbeatRequest,
    StepRequest,
)
from taskplat.common.logging import get_logger
from taskplat.common.telemetry import inject
from taskplat.worker_wrapper.dispatcher_client import (
    DispatcherProtocolError,
    DispatcherUnavailable,
    Rejection,
)
from taskplat.worker_wrapper.intake import Delivery
from taskplat.worker_wrapper.observability import DeleteWhy, TaskOutcome
from taskplat.worker_wrapper.operators import OperatorSpec
from taskplat.worker_wrapper.outcomes import (
    Abort,
    Failed,
    RunOutcome,
    Stopped,
    Succeeded,
    TaskInput,
    failure,
)
from taskplat.worker_wrapper.protocol import RecordsLine, SideLine, StepLine
from taskplat.worker_wrapper.publishing import PublishError, RecordPublisher

if TYPE_CHECKING:
    from taskplat.worker_wrapper.execution import TaskExecutor

EVENTS_PER_CALL = 1000
DRAIN_MESSAGE = "worker shutting down: operator stopped after the drain timeout"


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


class RunningTask:
    """A claimed attempt: runs the operator while heartbeating, then reports the outcome."""

    def __init__(
        self,
        executor: TaskExecutor,
        delivery: Delivery | None,
        claimed: ClaimedResponse,
        abort: Abort,
    ) -> None:
        self.x = executor
        self.delivery = delivery
        self.claimed = claimed
        self.abort = abort
        self.lease_expires = loop_time_of(claimed.lease_expires_at)
        self.deferred_events: list[Event] = []
        self.publisher = RecordPublisher(claimed.task.outputs, executor.intake.send_bodies)
        self.publish_error: str | None = None
        self.reporting = False
        self.run_seconds: float | None = None
        self.log = get_logger()

    @property
    def task_id(self) -> str:
        return str(self.claimed.task.task_id)

    async def run(self) -> TaskOutcome:
        """Run and report the attempt; return how it ended (see `observability`)."""
        telemetry = self.x.telemetry
        telemetry.busy(1)
        ended: TaskOutcome = "Stopped"
        loops = [asyncio.ensure_future(self._heartbeat_loop())]
        if self.delivery is not None:  # claimed ahead: no message to keep hidden, no task
            loops.append(asyncio.ensure_future(self._visibility_loop(self.delivery)))
        try:
            outcome = await self._publish_rest(await self._run_operator())
            self.abort.operator_exited()
            ended = await self._report(outcome)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            telemetry.busy(-1)
            telemetry.task_ended(self.claimed.task.operator, ended, self.run_seconds)
        return ended

    # ---- the operator -------------------------------------------------------------------

    async def _run_operator(self) -> RunOutcome:
        task = self.claimed.task
        runner = self.x.runners.get(task.operator)
        if runner is None:
            return failure(
                f"unknown operator {task.operator!r} on worker {self.x.settings.worker_id}"
            )
        spec = self.x.specs.get(task.operator)
        mode = spec.mode if spec is not None else "per-task"
        untrusted = task.trust == "untrusted" or (spec is not None and spec.untrusted)
        if untrusted and mode == "pooled":
            return failure(f"task is untrusted and operator {task.operator!r} is pooled")
        deadline = effective_deadline(self.claimed, spec, datetime.now(UTC))
        document = task.model_dump(mode="json")
        document["lease_token"] = str(self.claimed.lease_token)
        document["deadline_at"] = deadline.isoformat() if deadline is not None else None
        env = {
            "TASKPLAT_TASK_ID": str(task.task_id),
            "TASKPLAT_ATTEMPT": str(self.claimed.attempt),
            "TASKPLAT_LEASE_TOKEN": str(self.claimed.lease_token),
            "TASKPLAT_DEADLINE_AT": deadline.isoformat() if deadline is not None else "",
        }
        if untrusted and self.claimed.capability_token is not None:
            env["TASKPLAT_CAPABILITY_TOKEN"] = self.claimed.capability_token
            env["TRACE_TASK_CAPABILITY_TOKEN"] = self.claimed.capability_token
        with self.x.telemetry.tracer.start_as_current_span(
            "operator.run",
            attributes={"taskplat.operator": task.operator, "taskplat.operator.mode": mode},
        ) as span:
            carrier = inject()  # this span: the operator's own spans become its children
            if mode == "pooled":
                document.update(carrier)
            else:
                env.update({name.upper(): value for name, value in carrier.items()})
            loop = asyncio.get_running_loop()
            started = loop.time()
            outcome = await runner.run(
                TaskInput(document, env, untrusted=untrusted),
                deadline=loop_time_of(deadline) if deadline is not None else None,
                forward=self._forward,
                abort=self.abort,
            )
            self.run_seconds = loop.time() - started
            _annotate(span, outcome)
        return outcome

    async def _publish_rest(self, outcome: RunOutcome) -> RunOutcome:
        """A success only once every published record is in its buffer queue."""
        if not isinstance(outcome, Succeeded):
            return outcome
        if self.publish_error is None:
            try:
                await self.publisher.flush()
            except PublishError as exc:
                self.publish_error = str(exc)
        if self.publish_error is not None:
            return failure(f"publishing records failed: {self.publish_error}")
        return outcome

    async def _forward(self, line: SideLine) -> None:
        if isinstance(line, StepLine):
            await self._record_step(line)
        elif isinstance(line, RecordsLine):
            if self.publish_error is None:
                try:
                    await self.publisher.add(line.dataset_uuid, line.records)
                except PublishError as exc:
                    self.publish_error = str(exc)
        else:
            await self._forward_events(line)

    async def _record_step(self, line: StepLine) -> None:
        body = StepRequest(
            task_id=self.claimed.task.task_id,
            attempt=self.claimed.attempt,
            lease_token=self.claimed.lease_token,
            step=line.step.name,
            result=line.step.result,
        )
        try:
            answer = await self.x.client.step(body, until=self._call_bound())
        except (DispatcherUnavailable, DispatcherProtocolError) as exc:
            # Not recorded: a later attempt runs the step again (its effect is at-least-once).
            self.log.warning("step_not_recorded", step=line.step.name, error=str(exc))
            return
        if isinstance(answer, Rejection):
            self._rejected("steps", answer)

    async def _forward_events(self, events: Sequence[Event]) -> None:
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

    async def _visibility_loop(self, delivery: Delivery) -> None:
        while True:
            await asyncio.sleep(self.x.settings.visibility_extension_seconds)
            await self.x.intake.extend(delivery)

    async def _delete(self, why: DeleteWhy, **fields: object) -> None:
        if self.delivery is not None:
            await self.x.intake.delete(self.delivery, why, **fields)

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
                retryable=outcome.retryable,
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
                reason="Drained",
                events=self.deferred_events,
            )
        return None  # the lease is lost: this attempt reports nothing

    async def _report(self, outcome: RunOutcome) -> TaskOutcome:
        self.reporting = True
        request = self._completion(outcome)
        if request is None:
            assert isinstance(outcome, Stopped)
            self.log.warning("attempt_abandoned", detail=outcome.detail)
            await self._delete("rejected", detail=outcome.detail)
            return "Stopped"
        try:
            answer = await self.x.completions.complete(request, until=self._call_bound())
        except DispatcherUnavailable as exc:
            self.log.error("completion_not_reported_message_left", error=str(exc))
            return "Stopped"
        except DispatcherProtocolError as exc:
            if exc.status_code not in (413, 422) or request.status != "Completed":
                self.log.error("completion_refused_message_left", error=str(exc))
                return "Stopped"
            # The dispatcher refused the result itself (too large, invalid): fail the attempt.
            self.log.warning("completion_refused_reporting_failure", error=str(exc))
            return await self._report(failure(f"the dispatcher refused the result: {exc.body}"))
        if isinstance(answer, Rejection):
            self.log.warning("completion_rejected", reason=answer.reason, message=answer.message)
            await self._delete("rejected", reason=answer.reason)
            return "Stopped"
        fields: dict[str, object] = {
            "task_status": answer.task_status,
            "repeated": answer.repeated,
            "run_seconds": round(self.run_seconds, 3) if self.run_seconds is not None else None,
        }
        if request.status == "Failed":
            fields["error"] = request.error_message[:500] if request.error_message else None
            fields["retry_after_seconds"] = request.retry_after_seconds
            fields["reason"] = request.reason
        self.log.info(f"task_{request.status.lower()}", **fields)
        if self.delivery is not None:  # in the background: the slot is free at once
            self.x.intake.delete_soon(self.delivery, "completed")
        return request.status


def _annotate(span: Span, outcome: RunOutcome) -> None:
    """Record how the operator run ended on its span."""
    if isinstance(outcome, Succeeded):
        span.set_attribute("taskplat.operator.result", "succeeded")
    elif isinstance(outcome, Failed):
        span.set_attribute("taskplat.operator.result", "failed")
        span.set_status(Status(StatusCode.ERROR, outcome.error_message[:200]))
    else:
        span.set_attribute("taskplat.operator.result", f"stopped:{outcome.reason}")
