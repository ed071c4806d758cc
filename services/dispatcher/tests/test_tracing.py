"""The dispatcher's traces, exported to memory: a server span per request named after the route
template, child of the caller's `traceparent`; POST /tasks, replays and completions that make a
task Dead store their span's context in the outbox row the relay continues from; with tracing off
nothing is stored; the real process exports its spans over OTLP/HTTP before it exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from taskplat.common.telemetry import Telemetry
from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.dispatcher_calls import claimed, complete, create_task, replay
from taskplat.testkit.dispatcher_harness import API_KEY, WORKER_TOKEN, Dispatcher, serve_dispatcher
from taskplat.testkit.dispatcher_rows import outbox_rows

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"


@dataclass
class Traced:
    dispatcher: Dispatcher
    telemetry: Telemetry
    exporter: InMemorySpanExporter
    db_url: str

    def span(self, name: str, count: int = 1) -> list[ReadableSpan]:
        """The finished spans called `name`, once `count` of them were exported."""

        def finished() -> list[ReadableSpan]:
            self.telemetry.force_flush()
            spans = [s for s in self.exporter.get_finished_spans() if s.name == name]
            return spans if len(spans) >= count else []

        return wait_for(finished, timeout=10, what=f"{count} span(s) {name!r}")


@pytest.fixture
def traced(db_url: str) -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry("dispatcher", span_exporter=exporter)
    try:
        with serve_dispatcher(db_url, telemetry=telemetry) as dispatcher:
            yield Traced(dispatcher, telemetry, exporter, db_url)
    finally:
        telemetry.shutdown()


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent naming `span` (flags as the SDK set them, e.g. sampled + random)."""
    context = span.context
    flags = _hex(int(context.trace_flags), 2)
    return f"00-{_hex(context.trace_id, 32)}-{_hex(context.span_id, 16)}-{flags}"


def test_a_request_with_traceparent_gets_a_server_span_that_is_its_child(traced: Traced) -> None:
    dispatcher = traced.dispatcher
    task_id = create_task(dispatcher)["task_id"]
    response = dispatcher.worker.post(
        "/internal/task-claim",
        json={"task_id": task_id, "worker_id": "worker-1"},
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
    )
    assert response.status_code == 200, response.text

    (span,) = traced.span("HTTP POST /internal/task-claim")
    assert span.kind is SpanKind.SERVER
    assert _hex(span.context.trace_id, 32) == TRACE_ID
    assert span.parent is not None and _hex(span.parent.span_id, 16) == PARENT_SPAN_ID
    assert span.parent.is_remote
    assert span.context.trace_state.get("vendor") == "1"
    assert span.attributes is not None
    assert span.attributes["http.route"] == "/internal/task-claim"
    assert span.attributes["http.request.method"] == "POST"
    assert span.attributes["http.response.status_code"] == 200


def test_route_templates_name_the_spans_and_errors_mark_them(traced: Traced) -> None:
    dispatcher = traced.dispatcher
    task_id = create_task(dispatcher)["task_id"]
    assert dispatcher.api.get(f"/tasks/{task_id}").status_code == 200
    assert dispatcher.anonymous.get("/no/such/path").status_code == 404

    (read,) = traced.span("HTTP GET /tasks/{task_id}")
    assert read.parent is None  # no traceparent: a new trace
    (unmatched,) = traced.span("HTTP GET unmatched")
    assert unmatched.attributes is not None
    assert unmatched.attributes["http.response.status_code"] == 404
    assert unmatched.status.status_code is StatusCode.UNSET


def test_post_tasks_stores_its_span_context_in_the_outbox_row(traced: Traced) -> None:
    dispatcher = traced.dispatcher
    created = dispatcher.api.post(
        "/tasks", json={"operator": "echo"}, headers={"traceparent": TRACEPARENT}
    )
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]

    (span,) = traced.span("HTTP POST /tasks")
    assert _hex(span.context.trace_id, 32) == TRACE_ID
    (row,) = outbox_rows(traced.db_url, task_id)
    assert row["kind"] == "enqueue_task"
    assert _traceparent(span).startswith(f"00-{TRACE_ID}-")
    assert row["trace_context"] == {"traceparent": _traceparent(span)}

    # Without a caller's context, POST /tasks starts the task's trace.
    fresh_id = create_task(dispatcher)["task_id"]
    fresh = [s for s in traced.span("HTTP POST /tasks", count=2) if s is not span]
    (fresh_span,) = fresh
    assert fresh_span.parent is None
    (fresh_row,) = outbox_rows(traced.db_url, fresh_id)
    assert fresh_row["trace_context"] == {"traceparent": _traceparent(fresh_span)}


def test_a_replay_stores_its_span_context_in_its_outbox_row(traced: Traced) -> None:
    dispatcher = traced.dispatcher
    task_id = create_task(dispatcher, max_attempts=1)["task_id"]
    lease = claimed(dispatcher, task_id)
    assert complete(dispatcher, lease, "Failed").json()["task_status"] == "Dead"
    replayed = dispatcher.api.post(f"/tasks/{task_id}/retry", headers={"traceparent": TRACEPARENT})
    assert replayed.status_code == 200, replayed.text

    (span,) = traced.span("HTTP POST /tasks/{task_id}/retry")
    rows = outbox_rows(traced.db_url, task_id)
    assert [row["kind"] for row in rows] == ["enqueue_task", "dead_letter", "enqueue_task"]
    assert _traceparent(span).startswith(f"00-{TRACE_ID}-")
    assert rows[-1]["trace_context"] == {"traceparent": _traceparent(span)}
    # The dead-letter row continues the trace of the completion that made the task Dead.
    (completion,) = traced.span("HTTP POST /internal/task-complete")
    assert rows[1]["trace_context"] == {"traceparent": _traceparent(completion)}


def test_with_tracing_off_no_context_is_stored(db_url: str) -> None:
    with serve_dispatcher(db_url) as dispatcher:
        assert dispatcher.telemetry is not None and not dispatcher.telemetry.tracing
        created = dispatcher.api.post(
            "/tasks", json={"operator": "echo"}, headers={"traceparent": TRACEPARENT}
        )
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]
        (row,) = outbox_rows(db_url, task_id)
        assert row["trace_context"] is None
        assert replay(dispatcher, task_id).status_code == 409  # still Queued: no replay


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace collector that keeps the span names it receives."""

    received: list[str]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.received.extend(span.name for span in scope_spans.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_process_exports_its_spans_over_otlp_before_it_exits(db_url: str) -> None:
    """`python -m taskplat.dispatcher` with OTEL_EXPORTER_OTLP_ENDPOINT: the spans of its requests
    reach the collector even though uvicorn ends the process by re-raising SIGTERM."""
    received: list[str] = []
    handler = type("Collector", (_Collector,), {"received": received})
    collector = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "TASKPLAT_API_KEYS": API_KEY,
        "TASKPLAT_WORKER_TOKEN": WORKER_TOKEN,
        "TASKPLAT_DISPATCHER_PORT": str(port),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_port}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "taskplat.dispatcher"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def created() -> bool:
            try:
                response = httpx.post(
                    f"{base}/tasks",
                    json={"operator": "echo"},
                    headers={"Authorization": f"Bearer {API_KEY}", "traceparent": TRACEPARENT},
                )
            except httpx.TransportError:
                return False
            return response.status_code == 201

        wait_for(created, timeout=30, what="the dispatcher process to create a task")
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        collector.shutdown()
        collector.server_close()
    assert "HTTP POST /tasks" in received, received
