"""Pure ASGI middleware of every Starlette service (the dispatcher, the credential broker, the
query service): a server span and a duration sample for every HTTP request.

Invariants:
  * The `route` label and the span name use the matched route's template (`/tasks/{task_id}`),
    never the raw path, so the label's cardinality is the number of routes; a path no route
    matches is `unmatched`. A method a route does not allow keeps that route's template (405).
  * The span's parent is the W3C context of the request's `traceparent`/`tracestate` headers (a
    worker's span), so worker calls join the task attempt's trace. With tracing off no span is
    made and no header is read: the middleware only times the request.
  * `status` is the status the client received; a request whose handler raised before answering
    is recorded as 500 (Starlette's outermost error handler answers it).
  * Log context bound while handling a request (task_id, attempt, trace_id) is dropped when the
    request ends, so it never leaks into the next request served by the same task.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import structlog
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskplat.common.metric_specs import HTTP_SERVER_DURATION
from taskplat.common.telemetry import Telemetry, extract

UNMATCHED = "unmatched"
_TRACE_HEADERS = (b"traceparent", b"tracestate")


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The template of the route that serves `scope` (as Starlette's router picks it)."""
    partial: str | None = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", UNMATCHED))
        if match is Match.PARTIAL and partial is None:
            partial = str(getattr(route, "path", UNMATCHED))
    return partial or UNMATCHED


def _trace_carrier(scope: Scope) -> dict[str, str]:
    carrier: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name in _TRACE_HEADERS:
            carrier[name.decode("latin-1")] = value.decode("latin-1")
    return carrier


class _Answer:
    """The status sent to the client (500 until the response starts)."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = 500


class HttpTelemetryMiddleware:
    """Times every request into `taskplat.http.server.duration{method,route,status}` and, when
    tracing is on, wraps it in a SERVER span named `HTTP <METHOD> <route>`."""

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry, routes: Sequence[BaseRoute]) -> None:
        self._app = app
        self._telemetry = telemetry
        self._routes = routes
        self._duration = telemetry.histogram(HTTP_SERVER_DURATION)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        method: str = scope["method"]
        route = route_template(self._routes, scope)
        answer = _Answer()

        async def send_and_note_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer.status = int(message["status"])
            await send(message)

        log_context = structlog.contextvars.get_contextvars()
        started = time.perf_counter()
        try:
            if self._telemetry.tracing:
                await self._traced(scope, receive, send_and_note_status, method, route, answer)
            else:
                await self._app(scope, receive, send_and_note_status)
        finally:
            elapsed = time.perf_counter() - started
            self._duration.record(
                elapsed, {"method": method, "route": route, "status": str(answer.status)}
            )
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(**log_context)

    async def _traced(
        self, scope: Scope, receive: Receive, send: Send, method: str, route: str, answer: _Answer
    ) -> None:
        parent = extract(_trace_carrier(scope))
        with self._telemetry.tracer.start_as_current_span(
            f"HTTP {method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": route},
        ) as span:
            context = span.get_span_context()
            if context.is_valid:
                structlog.contextvars.bind_contextvars(trace_id=format(context.trace_id, "032x"))
            try:
                await self._app(scope, receive, send)
            finally:
                span.set_attribute("http.response.status_code", answer.status)
                if answer.status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
