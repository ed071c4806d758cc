"""The wrapper's client of the dispatcher's internal API (`/internal/*`, seed 004).

Invariants:
  * Every call carries `Authorization: Bearer <worker token>`; the token lives only here.
  * Network errors and 5xx answers are retried with capped full-jitter backoff until the caller's
    bound (`until`, event-loop time) would pass; then `DispatcherUnavailable` is raised and the
    caller leaves the SQS message in place. A call is never reported as answered when it was not.
  * 409, and 404 with a `Rejected` body, are rejections (stale attempt or lease, not running,
    canceled, unknown task); any other 4xx is a `DispatcherProtocolError` (wrong token, a body the
    dispatcher refused), never taken for a rejection: a wrongly configured URL must not make the
    wrapper delete messages.
  * Each call is one CLIENT span (`dispatcher.claim`, `dispatcher.heartbeat`, `dispatcher.events`,
    `dispatcher.complete`), and every HTTP request carries that span's W3C `traceparent` header,
    so the dispatcher's server spans join the task's trace. Each answer is counted by route and
    status, each request that got no answer by route.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

import httpx
from opentelemetry import trace
from pydantic import BaseModel, SecretStr, TypeAdapter, ValidationError

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.contracts import (
    ClaimedResponse,
    ClaimRequest,
    CompleteRequest,
    CompleteResponse,
    EventsAcceptedResponse,
    EventsRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    NotClaimedResponse,
    RejectedResponse,
)
from taskplat.common.errors import TaskplatError
from taskplat.common.logging import get_logger
from taskplat.common.telemetry import inject
from taskplat.worker_wrapper.observability import WrapperTelemetry

ModelT = TypeVar("ModelT", bound=BaseModel)
ClaimAnswer = ClaimedResponse | NotClaimedResponse
_CLAIM_ANSWER: TypeAdapter[ClaimAnswer] = TypeAdapter(ClaimAnswer)
_BODY_EXCERPT = 500


class DispatcherUnavailable(TaskplatError):
    code = "dispatcher_unavailable"


class DispatcherProtocolError(TaskplatError):
    code = "dispatcher_protocol_error"

    def __init__(self, message: str, *, status_code: int, body: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


@dataclass(frozen=True)
class Rejection:
    """The dispatcher refused a call of a stale or finished attempt (409, or 404 Rejected)."""

    reason: str
    message: str | None = None


class DispatcherClient:
    def __init__(
        self,
        base_url: str,
        token: SecretStr,
        *,
        timeout_seconds: float = 10.0,
        connect_timeout_seconds: float = 5.0,
        retry_base_seconds: float = 0.2,
        retry_max_seconds: float = 5.0,
        telemetry: WrapperTelemetry | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={
                "Authorization": f"Bearer {token.get_secret_value()}",
                "Content-Type": "application/json",
            },
            timeout=httpx.Timeout(timeout_seconds, connect=connect_timeout_seconds),
        )
        self._retry_base = retry_base_seconds
        self._retry_max = retry_max_seconds
        self._telemetry = telemetry or WrapperTelemetry()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def claim(self, task_id: UUID, worker_id: str, *, until: float) -> ClaimAnswer:
        body = ClaimRequest(task_id=task_id, worker_id=worker_id)
        response = await self._post("/internal/task-claim", body, until=until, span="claim")
        if response.status_code != 200:
            raise _unexpected(response)
        try:
            return _CLAIM_ANSWER.validate_json(response.content)
        except ValidationError as exc:
            raise _unexpected(
                response, f"unexpected claim answer: {exc.error_count()} errors"
            ) from exc

    async def heartbeat(
        self, body: HeartbeatRequest, *, until: float
    ) -> HeartbeatResponse | Rejection:
        return await self._worker_call(
            "/internal/heartbeat", body, HeartbeatResponse, until, span="heartbeat"
        )

    async def events(
        self, body: EventsRequest, *, until: float
    ) -> EventsAcceptedResponse | Rejection:
        return await self._worker_call(
            "/internal/events", body, EventsAcceptedResponse, until, span="events"
        )

    async def complete(
        self, body: CompleteRequest, *, until: float
    ) -> CompleteResponse | Rejection:
        return await self._worker_call(
            "/internal/task-complete", body, CompleteResponse, until, span="complete"
        )

    async def _worker_call(
        self, path: str, body: BaseModel, answer: type[ModelT], until: float, *, span: str
    ) -> ModelT | Rejection:
        response = await self._post(path, body, until=until, span=span)
        try:
            if response.status_code == 200:
                return answer.model_validate_json(response.content)
            if response.status_code in (404, 409):
                rejected = RejectedResponse.model_validate_json(response.content)
                return Rejection(rejected.reason, rejected.message)
        except ValidationError as exc:
            raise _unexpected(response, f"unexpected answer from {path}") from exc
        raise _unexpected(response)

    async def _post(self, path: str, body: BaseModel, *, until: float, span: str) -> httpx.Response:
        attributes = {"http.request.method": "POST", "url.path": path}
        task_id = getattr(body, "task_id", None)
        if task_id is not None:
            attributes["taskplat.task_id"] = str(task_id)
        with self._telemetry.tracer.start_as_current_span(
            f"dispatcher.{span}", kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as current:
            response = await self._post_with_retries(path, body, until=until)
            current.set_attribute("http.response.status_code", response.status_code)
            return response

    async def _post_with_retries(
        self, path: str, body: BaseModel, *, until: float
    ) -> httpx.Response:
        loop = asyncio.get_running_loop()
        content = body.model_dump_json(exclude_none=False).encode()
        headers = inject()  # the current span: this call's
        failures = 0
        while True:
            try:
                response = await self._http.post(path, content=content, headers=headers)
            except httpx.HTTPError as exc:
                self._telemetry.dispatcher_call_error(path)
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                self._telemetry.dispatcher_call(path, response.status_code)
                if response.status_code < 500:
                    return response
                problem = f"HTTP {response.status_code}"
            failures += 1
            delay = full_jitter_delay(self._retry_base, self._retry_max, failures)
            if loop.time() + delay > until:
                raise DispatcherUnavailable(f"{path}: {problem} (gave up after {failures} tries)")
            get_logger().warning(
                "dispatcher_call_retry", path=path, problem=problem, failures=failures
            )
            await asyncio.sleep(delay)


def _unexpected(response: httpx.Response, what: str | None = None) -> DispatcherProtocolError:
    excerpt = response.text[:_BODY_EXCERPT]
    message = what or f"{response.request.url.path}: unexpected HTTP {response.status_code}"
    return DispatcherProtocolError(
        f"{message}: {excerpt}", status_code=response.status_code, body=excerpt
    )
