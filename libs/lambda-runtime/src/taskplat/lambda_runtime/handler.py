"""`taskplat_handler(operator)`: the Lambda handler of a Taskplat operator.

The event is the claim the outbox relay made on the function's behalf (the `task-claim` answer:
`task`, `attempt`, `lease_token`, `lease_expires_at`, `attempt_token`, and for an untrusted job
`capability_token`, which the operator reads as `task.capability_token`). The dispatcher's URL is
the function's `TASKPLAT_DISPATCHER_URL`; the function holds no worker token and no database
credentials, only the tokens of the attempt it was invoked for.

Invariants:
  * the first call is a heartbeat, and nothing runs before it answered: it waits on the relay's
    transaction (the task row is locked until the claim commits), so an invocation whose claim
    never committed, a duplicate invocation of an attempt, or an invocation of an attempt the
    reaper already expired is refused there and runs no operator code (answer `Refused`);
  * while the operator runs, a heartbeat every third of the lease keeps the attempt; a refused
    heartbeat means the attempt was taken away (canceled, expired): the completion will be
    refused too, and events are refused at once;
  * the operator's events go to `/internal/events` as it emits them, and its step results to
    `/internal/steps`, with the lease token;
  * the completion is sent once: `Completed` with the result, or `Failed` with the error of an
    exception (with `retryable: false` for a `PermanentFailure`: no retry, the task is Dead), or
    `Failed` "timed out" when the operator has not finished `margin_seconds` before the earlier
    of the function's limit (`context.get_remaining_time_in_millis()`) and the attempt's
    deadline; the operator's thread is then abandoned, and the sandbox exits after
    reporting so no abandoned code runs on into a later invocation;
  * the handler itself never raises for an operator's failure (Lambda's own retries are off and
    Taskplat owns attempts); it returns what happened.
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from taskplat.lambda_runtime.dispatcher import AttemptApi, Refused, Unreachable
from taskplat.lambda_runtime.operator import Handler, OperatorFailure, Task, run_operator
from taskplat.lambda_runtime.query_client import invocation_token

URL_ENV = "TASKPLAT_DISPATCHER_URL"
MARGIN_ENV = "TASKPLAT_LAMBDA_MARGIN_SECONDS"
DEFAULT_MARGIN_SECONDS = 2.0
MAX_HEARTBEAT_INTERVAL = 20.0


class LambdaContext(Protocol):
    def get_remaining_time_in_millis(self) -> int: ...


class LeaseLost(OperatorFailure):
    """The attempt no longer holds the task: its events and completion are refused."""


def _log(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=str), file=sys.stderr, flush=True)


def _deadline_seconds(deadline_at: str | None) -> float | None:
    if not deadline_at:
        return None
    try:
        return datetime.fromisoformat(deadline_at).timestamp() - time.time()
    except ValueError:
        return None


class _Invocation:
    def __init__(
        self,
        event: Mapping[str, Any],
        context: LambdaContext,
        operator: Handler,
        *,
        url: str,
        margin_seconds: float,
    ) -> None:
        self._operator = operator
        self._context = context
        self._margin = margin_seconds
        self._started = time.monotonic()
        document = dict(event["task"])
        document["lease_token"] = str(event["lease_token"])
        if event.get("capability_token"):
            # An untrusted job's token travels in the payload, never in the environment.
            document["capability_token"] = str(event["capability_token"])
        self.task = Task.from_document(document)
        deadline = _deadline_seconds(self.task.deadline_at)
        self._deadline_left = deadline
        self.api = AttemptApi(
            url,
            attempt_token=str(event["attempt_token"]),
            task_id=self.task.task_id,
            attempt=self.task.attempt,
            lease_token=self.task.lease_token,
            seconds_left=self.seconds_left,
        )
        self._stop = threading.Event()
        self.lease_lost = threading.Event()
        # For `query`: the invocation's capability token (untrusted jobs), never an env variable.
        token = event.get("capability_token")
        self.capability_token = str(token) if token else None

    def seconds_left(self) -> float:
        """Time left before the earlier of the function's limit and the attempt's deadline."""
        left = self._context.get_remaining_time_in_millis() / 1000.0
        if self._deadline_left is not None:
            left = min(left, self._deadline_left - (time.monotonic() - self._started))
        return left

    def events(self, events: list[dict[str, Any]]) -> None:
        if self.lease_lost.is_set():
            raise LeaseLost("the attempt lost its lease; its events are refused")
        try:
            self.api.events(events)
        except Refused as exc:
            self.lease_lost.set()
            raise LeaseLost(f"events refused: {exc.reason}") from None

    def step(self, name: str, result: Any) -> Any:
        if self.lease_lost.is_set():
            raise LeaseLost("the attempt lost its lease; its steps are refused")
        try:
            return self.api.step(name, result)
        except Refused as exc:
            self.lease_lost.set()
            raise LeaseLost(f"step refused: {exc.reason}") from None

    def _heartbeats(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                answer = self.api.heartbeat()
            except Refused as exc:
                self.lease_lost.set()
                _log("taskplat_lease_lost", task_id=self.task.task_id, reason=exc.reason)
                return
            except Unreachable as exc:
                _log("taskplat_heartbeat_failed", task_id=self.task.task_id, error=str(exc))
                continue
            interval = _interval(answer)

    def run(self) -> dict[str, Any]:
        fence = {"task_id": self.task.task_id, "attempt": self.task.attempt}
        try:
            first = self.api.heartbeat()
        except Refused as exc:
            _log("taskplat_invocation_refused", **fence, reason=exc.reason)
            return {"status": "Refused", "reason": exc.reason, **fence}
        except Unreachable as exc:
            _log("taskplat_dispatcher_unreachable", **fence, error=str(exc))
            return {"status": "Unreachable", **fence}
        beating = threading.Thread(
            target=self._heartbeats, args=(_interval(first),), daemon=True, name="heartbeat"
        )
        beating.start()
        outcome: dict[str, Any] = {}
        context = contextvars.copy_context()

        def work() -> None:
            outcome.update(context.run(run_operator, self._operator, self.task, self))

        running = threading.Thread(target=work, daemon=True, name="operator")
        running.start()
        running.join(max(0.0, self.seconds_left() - self._margin))
        timed_out = running.is_alive()
        if timed_out:
            left = max(0.0, self.seconds_left())
            outcome = {
                "status": "failed",
                "error": f"timed out: the operator was still running {left:.1f}s before the "
                "function's time limit",
            }
        self._stop.set()
        try:
            answer = self._complete(outcome)
        except Refused as exc:
            _log("taskplat_completion_refused", **fence, reason=exc.reason)
            answer = {"status": "Refused", "reason": exc.reason}
        except Unreachable as exc:
            _log("taskplat_dispatcher_unreachable", **fence, error=str(exc))
            answer = {"status": "Unreachable"}
        beating.join(timeout=1.0)
        status = "Completed" if outcome.get("status") == "succeeded" else "Failed"
        result = {"status": answer.get("status"), "outcome": status, **fence}
        if "task_status" in answer:
            result["task_status"] = answer["task_status"]
        _log("taskplat_attempt_reported", **result)
        if timed_out:
            # The abandoned operator thread must not run on into the next invocation of this
            # sandbox: exiting resets it (Lambda starts a fresh one; its retries are off).
            sys.stdout.flush()
            os._exit(0)
        return result

    def _complete(self, outcome: Mapping[str, Any]) -> dict[str, Any]:
        if outcome.get("status") == "succeeded":
            return self.api.complete(
                "Completed",
                result=outcome.get("payload"),
                outputs=outcome.get("outputs"),
                events=outcome.get("events"),
            )
        error = str(outcome.get("error") or "operator failed")
        if outcome.get("retryable") is False:
            return self.api.complete("Failed", error_message=error[:16_000], retryable=False)
        return self.api.complete("Failed", error_message=error[:16_000])


def _interval(answer: Mapping[str, Any]) -> float:
    """A third of the lease the dispatcher just granted (bounded)."""
    expires = _deadline_seconds(answer.get("lease_expires_at"))
    if expires is None:
        return 5.0
    return max(0.5, min(MAX_HEARTBEAT_INTERVAL, expires / 3.0))


def taskplat_handler(
    operator: Handler,
    *,
    dispatcher_url: str | None = None,
    margin_seconds: float | None = None,
) -> Callable[[Mapping[str, Any], LambdaContext], dict[str, Any]]:
    """The Lambda handler that runs `operator` for the attempt in its event."""

    def handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        url = dispatcher_url or os.environ.get(URL_ENV)
        if not url:
            raise RuntimeError(f"{URL_ENV} is not set: the function cannot reach the dispatcher")
        margin = margin_seconds
        if margin is None:
            margin = float(os.environ.get(MARGIN_ENV) or DEFAULT_MARGIN_SECONDS)
        # The attempt's capability token (untrusted jobs), for `query` in the operator's context.
        capability = event.get("capability_token")
        reset = invocation_token.set(str(capability) if capability else None)
        try:
            return _Invocation(event, context, operator, url=url, margin_seconds=margin).run()
        finally:
            invocation_token.reset(reset)

    return handler
