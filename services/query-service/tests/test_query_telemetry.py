"""The query service's traces and metrics, exported to memory (real Postgres, LocalStack, the
real app on uvicorn): a query with a `traceparent` gets a SERVER span of that trace and an
INTERNAL `query.execute` span inside it, both naming the token's task and attempt; every request
is timed in `taskplat_http_server_duration_seconds{method,route,status}` as the dispatcher's
are."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from query_harness import Dataset, mint, served, settings

from taskplat.common.telemetry import Telemetry
from taskplat.devstack.attempts import running_attempt
from taskplat.devstack.waiting import wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(exporter: InMemorySpanExporter) -> Iterator[Telemetry]:
    telemetry = Telemetry("query-service", span_exporter=exporter)
    yield telemetry
    telemetry.shutdown()


@pytest.fixture
def traced(reader_url: str, sqs_endpoint_url: str, telemetry: Telemetry) -> Iterator[httpx.Client]:
    with served(settings(reader_url, sqs_endpoint_url), telemetry=telemetry) as client:
        yield client


def _spans(telemetry: Telemetry, exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    def finished() -> list[ReadableSpan]:
        telemetry.force_flush()
        spans = list(exporter.get_finished_spans())
        return spans if len(spans) >= count else []

    return wait_for(finished, timeout=10, what=f"{count} spans")


def test_a_query_with_traceparent_is_a_span_of_that_trace(
    traced: httpx.Client,
    inputs: tuple[Dataset, Dataset],
    telemetry: Telemetry,
    exporter: InMemorySpanExporter,
) -> None:
    task_id = running_attempt(inputs[0].database, [d.pin() for d in inputs])
    token = mint(inputs, task_id=task_id)
    answer = traced.post(
        "/query",
        headers={"Authorization": f"Bearer {token}", "traceparent": TRACEPARENT},
        json={"sql": "SELECT block FROM alerts ORDER BY block"},
    )
    assert answer.status_code == 200, answer.text

    spans = {span.name: span for span in _spans(telemetry, exporter, 2)}
    server, execute = spans["HTTP POST /query"], spans["query.execute"]
    assert server.kind is SpanKind.SERVER and execute.kind is SpanKind.INTERNAL
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert server.parent is not None and format(server.parent.span_id, "016x") == PARENT_SPAN_ID
    assert execute.context.trace_id == server.context.trace_id
    assert execute.parent is not None and execute.parent.span_id == server.context.span_id
    for span in (server, execute):
        assert span.attributes is not None
        assert span.attributes["taskplat.task_id"] == str(task_id)
        assert span.attributes["taskplat.attempt"] == 1
    assert execute.attributes is not None and execute.attributes["taskplat.query.rows"] == 3
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200
    assert all("SELECT" not in str(value) for value in (server.attributes or {}).values())


def test_requests_are_timed_by_route_and_answers_counted_by_outcome(
    traced: httpx.Client, inputs: tuple[Dataset, Dataset]
) -> None:
    assert traced.post("/query", json={"sql": "SELECT 1"}).status_code == 401
    token = mint(inputs)
    answer = traced.post(
        "/query", headers={"Authorization": f"Bearer {token}"}, json={"sql": "SELECT 1"}
    )
    assert answer.status_code == 200, answer.text
    text = traced.get("/metrics").text
    for line in (
        'taskplat_http_server_duration_seconds_count{method="POST",route="/query",'
        'status="401"} 1.0',
        'taskplat_http_server_duration_seconds_count{method="POST",route="/query",'
        'status="200"} 1.0',
        'taskplat_query_requests_total{outcome="answered"} 1.0',
        "taskplat_query_duration_seconds_count 1.0",
    ):
        assert line in text, (line, text)
