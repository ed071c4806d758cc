"""The broker's traces and metrics, exported to memory (real STS on LocalStack): a request with a
`traceparent` gets a SERVER span of that trace, its AssumeRole a CLIENT span inside it, both
naming the capability's task and attempt; every request is timed in
`taskplat_http_server_duration_seconds{method,route,status}` as the dispatcher's are."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from broker_harness import BUCKET, aws, broker_settings, make_role, mint, served
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from taskplat.common.clock import FakeClock
from taskplat.common.telemetry import Telemetry
from taskplat.devstack.waiting import wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(exporter: InMemorySpanExporter) -> Iterator[Telemetry]:
    telemetry = Telemetry("credential-broker", span_exporter=exporter)
    yield telemetry
    telemetry.shutdown()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
def broker(sqs_endpoint_url: str, clock: FakeClock, telemetry: Telemetry) -> Iterator[httpx.Client]:
    aws("s3", sqs_endpoint_url).create_bucket(Bucket=BUCKET)
    settings = broker_settings(make_role(sqs_endpoint_url), sqs_endpoint_url)
    with served(settings, aws("sts", sqs_endpoint_url), clock, telemetry) as client:
        yield client


def _spans(telemetry: Telemetry, exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    def finished() -> list[ReadableSpan]:
        telemetry.force_flush()
        spans = list(exporter.get_finished_spans())
        return spans if len(spans) >= count else []

    return wait_for(finished, timeout=10, what=f"{count} spans")


def test_a_request_with_traceparent_is_a_span_of_that_trace_with_its_sts_call(
    broker: httpx.Client, clock: FakeClock, telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    minted = mint(clock.now())
    answer = broker.post(
        "/credentials",
        headers={"Authorization": f"Bearer {minted.token}", "traceparent": TRACEPARENT},
    )
    assert answer.status_code == 200, answer.text

    spans = {span.name: span for span in _spans(telemetry, exporter, 2)}
    server, sts = spans["HTTP POST /credentials"], spans["sts.assume_role"]
    assert server.kind is SpanKind.SERVER and sts.kind is SpanKind.CLIENT
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert server.parent is not None and format(server.parent.span_id, "016x") == PARENT_SPAN_ID
    assert sts.context.trace_id == server.context.trace_id
    assert sts.parent is not None and sts.parent.span_id == server.context.span_id
    for span in (server, sts):
        assert span.attributes is not None
        assert span.attributes["taskplat.task_id"] == str(minted.capability.task_id)
        assert span.attributes["taskplat.attempt"] == minted.capability.attempt
    assert server.attributes is not None
    assert server.attributes["http.response.status_code"] == 200


def test_requests_are_timed_by_route_and_answers_counted_by_outcome(
    broker: httpx.Client, clock: FakeClock
) -> None:
    assert broker.post("/credentials").status_code == 401
    minted = mint(clock.now())
    assert (
        broker.post("/credentials", headers={"Authorization": f"Bearer {minted.token}"})
    ).status_code == 200
    assert broker.get("/nowhere").status_code == 404
    text = broker.get("/metrics").text
    for line in (
        'taskplat_http_server_duration_seconds_count{method="POST",route="/credentials",'
        'status="401"} 1.0',
        'taskplat_http_server_duration_seconds_count{method="POST",route="/credentials",'
        'status="200"} 1.0',
        'taskplat_http_server_duration_seconds_count{method="GET",route="unmatched",'
        'status="404"} 1.0',
        'taskplat_broker_requests_total{outcome="issued"} 1.0',
        'taskplat_broker_requests_total{outcome="unauthorized"} 1.0',
    ):
        assert line in text, (line, text)
