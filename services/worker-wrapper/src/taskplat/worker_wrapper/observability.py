"""The worker wrapper's metrics, tracer and liveness (the plan's "Worker wrapper" section).

Invariants:
  * One `WrapperTelemetry` per wrapper, built on the process's one `Telemetry` (created in
    `__main__`, or by a test); `WrapperTelemetry(None)` records and traces nothing, for runners and
    clients built on their own. Nothing here is a module global.
  * Label values are bounded: queue, operator, route, status, why, op, reason, outcome, mode, result
    (never a task id). `operator` is the task's operator name, as on the dispatcher's metrics.
  * `taskplat.worker.tasks{outcome}` counts each claimed attempt once, when it ends: `Completed`,
    `Failed` or `Canceled` when the dispatcher accepted a completion with that status; `Stopped`
    when the attempt ended without an accepted report (lease lost, completion rejected as stale,
    or the report could not be delivered). `taskplat.operator.run_time` uses the same outcome.
  * `IntakeHealth` is the intake loop's liveness: a mark set each time a receive poll returned
    (or a saturated wrapper's wait timed out), healthy while the last mark is younger than
    `stall_seconds`; once the wrapper drains it reports `draining` (healthy: it is exiting).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.metrics import NoOpMeter

from taskplat.common.loops import LoopHealth
from taskplat.common.telemetry import Metric, Telemetry
from taskplat.worker_wrapper.metric_specs import (
    DISPATCHER_CALL_ERRORS,
    DISPATCHER_CALLS,
    OPERATOR_CRASHES,
    OPERATOR_KILLS,
    OPERATOR_RUN_TIME,
    OPERATOR_STARTS,
    SQS_DELETED,
    SQS_ERRORS,
    SQS_RECEIVED,
    SQS_REQUESTS,
    WORKER_BUSY,
    WORKER_CLAIMS,
    WORKER_TASKS,
)

SERVICE = "worker-wrapper"

DeleteWhy = Literal["not_claimed", "completed", "rejected", "poison"]
SqsOp = Literal["receive", "delete", "change_visibility", "send_batch"]
SqsRequest = Literal["receive", "delete", "delete_batch", "change_visibility", "send_batch"]
TaskOutcome = Literal["Completed", "Failed", "Canceled", "Stopped"]
KillReason = Literal["deadline", "canceled", "lease_lost", "draining", "flood", "protocol_error"]


class WrapperTelemetry:
    """The instruments of one wrapper; every method is cheap and thread-safe."""

    def __init__(self, telemetry: Telemetry | None = None, *, queue: str = "default") -> None:
        self.queue = queue
        self.telemetry = telemetry
        self._running = 0
        self._busy_listeners: list[Callable[[int], None]] = []
        self.tracer: trace.Tracer = (
            telemetry.tracer if telemetry is not None else trace.NoOpTracer()
        )
        noop = NoOpMeter("taskplat.worker-wrapper")

        def counter(spec: Metric) -> Any:
            if telemetry is None:
                return noop.create_counter(spec.name)
            return telemetry.counter(spec)

        self._received = counter(SQS_RECEIVED)
        self._deleted = counter(SQS_DELETED)
        self._sqs_requests = counter(SQS_REQUESTS)
        self._sqs_errors = counter(SQS_ERRORS)
        self._claims = counter(WORKER_CLAIMS)
        self._tasks = counter(WORKER_TASKS)
        self._starts = counter(OPERATOR_STARTS)
        self._crashes = counter(OPERATOR_CRASHES)
        self._kills = counter(OPERATOR_KILLS)
        self._calls = counter(DISPATCHER_CALLS)
        self._call_errors = counter(DISPATCHER_CALL_ERRORS)
        if telemetry is None:
            self._run_time: Any = noop.create_histogram(OPERATOR_RUN_TIME.name)
            self._busy: Any = noop.create_up_down_counter(WORKER_BUSY.name)
        else:
            self._run_time = telemetry.histogram(OPERATOR_RUN_TIME)
            self._busy = telemetry.up_down_counter(WORKER_BUSY)

    # ---- SQS ----------------------------------------------------------------------------

    def received(self, count: int) -> None:
        if count:
            self._received.add(count, {"queue": self.queue})

    def deleted(self, why: DeleteWhy) -> None:
        self._deleted.add(1, {"queue": self.queue, "why": why})

    def sqs_request(self, op: SqsRequest) -> None:
        self._sqs_requests.add(1, {"queue": self.queue, "op": op})

    def sqs_error(self, op: SqsOp) -> None:
        self._sqs_errors.add(1, {"queue": self.queue, "op": op})

    # ---- tasks --------------------------------------------------------------------------

    def claim(self, result: str) -> None:
        self._claims.add(1, {"queue": self.queue, "result": result})

    def task_ended(self, operator: str, outcome: TaskOutcome, run_seconds: float | None) -> None:
        self._tasks.add(1, {"operator": operator, "outcome": outcome})
        if run_seconds is not None:
            self._run_time.record(run_seconds, {"operator": operator, "outcome": outcome})

    def busy(self, delta: int) -> None:
        self._busy.add(delta)
        self._running += delta
        for listener in self._busy_listeners:
            listener(self._running)

    def watch_busy(self, listener: Callable[[int], None]) -> None:
        """Call `listener(running attempts)` after every change (in the caller's thread)."""
        self._busy_listeners.append(listener)

    # ---- operator processes -------------------------------------------------------------

    def operator_started(self, operator: str, mode: str) -> None:
        self._starts.add(1, {"operator": operator, "mode": mode})

    def operator_crashed(self, operator: str) -> None:
        self._crashes.add(1, {"operator": operator})

    def operator_killed(self, operator: str, reason: KillReason) -> None:
        self._kills.add(1, {"operator": operator, "reason": reason})

    # ---- the dispatcher -----------------------------------------------------------------

    def dispatcher_call(self, route: str, status: int) -> None:
        self._calls.add(1, {"route": route, "status": str(status)})

    def dispatcher_call_error(self, route: str) -> None:
        self._call_errors.add(1, {"route": route})


class IntakeHealth:
    """Liveness of the intake loop for `/healthz` (thread-safe: read by the ops server)."""

    def __init__(self) -> None:
        self.progress = LoopHealth()
        self.draining = False

    def polled(self) -> None:
        self.progress.progressed()

    def poll_failed(self) -> None:
        self.progress.failed()

    def check(self, stall_seconds: float) -> tuple[bool, str]:
        if self.draining:
            return True, "draining"
        idle = self.progress.seconds_since_progress()
        if idle > stall_seconds:
            errors = self.progress.errors
            return False, f"no SQS receive completed for {idle:.0f}s ({errors} failed so far)"
        return True, f"last receive {idle:.1f}s ago"
