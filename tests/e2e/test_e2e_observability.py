"""End to end, issue 6: one task's trace crosses the dispatcher, the relay and the worker wrapper
(or, taken by a waiting claim, goes from its create to the worker), and the metrics endpoints of
the running processes count a known workload.

The stack exports traces over OTLP/HTTP to a collector run by this test (a real collector of the
OTLP protocol, decoding the protobuf requests every process sends).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from e2e_stack import E2EStack, e2e_stack
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str


@dataclass
class Collector:
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        attribute.value.string_value
                        for attribute in resource_spans.resource.attributes
                        if attribute.key == "service.name"
                    ),
                    "",
                )
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            ReceivedSpan(
                                service,
                                span.name,
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                            )
                        )

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [span for span in self.spans if span.trace_id == trace_id]


def _serve(collector: Collector) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                collector.add(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, str]]:
    received = Collector()
    server = _serve(received)
    try:
        yield received, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def stack(
    database_url: str,
    sqs_endpoint_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    collector: tuple[Collector, str],
) -> Iterator[E2EStack]:
    _, endpoint = collector
    with e2e_stack(
        "observability",
        tmp_path_factory.mktemp("stack-observability"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=1,
        queues=("default", "woken"),
        worker_queues=("default",),
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            # Export finished spans within half a second instead of the SDK's 5 s default.
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        },
    ) as running:
        yield running


CLIENT_SPAN_ID = "00f067aa0ba902b7"


def _traced_task(stack: E2EStack, trace_id: str, queue: str) -> None:
    response = stack.api.post(
        "/tasks",
        json={"operator": "echo", "config": {"traced": True}, "queue": queue},
        headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01"},
    )
    assert response.status_code == 201, response.text
    stack.wait_status(response.json()["task_id"], "Completed", timeout=30)


def _whole_trace(received: Collector, trace_id: str, wanted: set[str]) -> dict[str, ReceivedSpan]:
    def spans() -> list[ReceivedSpan] | None:
        found = received.trace(trace_id)
        return found if wanted <= {span.name for span in found} else None

    found = wait_for(spans, timeout=30, what="every service's spans of the task's trace")
    return {span.name: span for span in found}


def _descends_from(spans: dict[str, ReceivedSpan], name: str, ancestor: ReceivedSpan) -> bool:
    ids = {span.span_id: span for span in spans.values()}
    span = spans[name]
    while span.parent_span_id in ids:
        span = ids[span.parent_span_id]
        if span.span_id == ancestor.span_id:
            return True
    return False


def test_one_trace_links_the_dispatcher_the_relay_and_the_worker(
    stack: E2EStack, collector: tuple[Collector, str]
) -> None:
    """A task run by its SQS wake-up: a wrapper that does not poll the dispatcher."""
    received, _ = collector
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    worker = stack.stack.add_worker("woken", env={"TASKPLAT_WORKER_POLL_DISPATCHER": "false"})
    try:
        # Only once it takes work: a wrapper slower to start than the scheduler's requeue (3 s,
        # seen on a busy machine) would claim the task from the republished wake-up's trace.
        log = stack.stack.log_dir / f"{worker}.log"
        wait_for(
            lambda: "worker_wrapper_started" in log.read_text(errors="replace"),
            timeout=60,
            what=f"{worker} to start",
            interval=0.1,
        )
        _traced_task(stack, trace_id, "woken")
    finally:
        stack.stack.remove(worker)
    wanted = {"HTTP POST /tasks", "outbox.send", "task.attempt", "operator.run"}
    complete = {"HTTP POST /internal/task-claim", "HTTP POST /internal/task-complete"}
    by_name = _whole_trace(received, trace_id, wanted | complete)
    services = {span.service for span in by_name.values()}
    assert {
        "taskplat-dispatcher",
        "taskplat-outbox-relay",
        "taskplat-worker-wrapper",
    } <= services, services

    # The chain: client -> POST /tasks -> outbox.send -> task.attempt -> claim/complete calls.
    create = by_name["HTTP POST /tasks"]
    assert create.parent_span_id == CLIENT_SPAN_ID
    relay = by_name["outbox.send"]
    assert relay.parent_span_id == create.span_id
    attempt = by_name["task.attempt"]
    assert attempt.parent_span_id == relay.span_id
    for name in ("HTTP POST /internal/task-claim", "HTTP POST /internal/task-complete"):
        assert _descends_from(by_name, name, attempt), name
    assert by_name["HTTP POST /internal/task-claim"].service == "taskplat-dispatcher"


def test_a_task_taken_by_a_waiting_claim_continues_the_trace_of_its_create(
    stack: E2EStack, collector: tuple[Collector, str]
) -> None:
    received, _ = collector
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    _traced_task(stack, trace_id, "default")  # its wrapper polls the dispatcher
    wanted = {"HTTP POST /tasks", "task.attempt", "operator.run"}
    by_name = _whole_trace(received, trace_id, wanted | {"HTTP POST /internal/task-complete"})
    create = by_name["HTTP POST /tasks"]
    attempt = by_name["task.attempt"]
    assert attempt.parent_span_id == create.span_id, "no wake-up between them"
    assert attempt.service == "taskplat-worker-wrapper"
    assert _descends_from(by_name, "operator.run", attempt)
    assert _descends_from(by_name, "HTTP POST /internal/task-complete", attempt)


def _metrics(url: str) -> str:
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    return response.text


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_metrics_endpoints_count_a_known_workload(stack: E2EStack) -> None:
    dispatcher_url = str(stack.api.base_url).rstrip("/")
    ops = stack.stack.ops_urls
    before = {
        "created": _value(
            _metrics(dispatcher_url),
            'taskplat_tasks_created_total{operator="echo",queue="default"}',
        ),
    }
    task_ids = stack.create_many([{"operator": "echo", "config": {"n": n}} for n in range(20)])
    assert stack.wait_all_terminal(task_ids, timeout=60) == {"Completed": 20}

    dispatcher = _metrics(dispatcher_url)
    created = 'taskplat_tasks_created_total{operator="echo",queue="default"}'
    assert _value(dispatcher, created) - before["created"] == 20
    assert _value(dispatcher, 'taskplat_tasks_current{queue="default",status="Queued"}') == 0

    def relayed() -> bool:
        relay = _metrics(ops["relay"])
        return _value(relay, 'taskplat_outbox_relayed_total{kind="enqueue_task"}') >= 20

    wait_for(relayed, timeout=10, what="the relay's counter of sent wake-ups")
    worker_name = next(name for name in ops if name.startswith("worker"))
    worker = _metrics(ops[worker_name])
    assert _value(worker, 'taskplat_worker_tasks_total{operator="echo",outcome="Completed"}') >= 20
    for name, url in ops.items():
        health = httpx.get(f"{url}/healthz", timeout=10)
        assert health.status_code == 200, (name, health.text)
