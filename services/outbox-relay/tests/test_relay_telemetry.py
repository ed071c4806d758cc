"""What the relay reports: SQS send counters by queue and kind, and an "outbox.send" span per row
that joins the task's trace and is the parent the SQS message names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from relay_harness import Queues, Rows, metric_lines, task_ids_of

from taskplat.common.telemetry import Telemetry
from taskplat.outbox_relay.relay import Relay, RelayBatch

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(exporter: InMemorySpanExporter) -> Iterator[Telemetry]:
    telemetry = Telemetry("outbox-relay", span_exporter=exporter)
    yield telemetry
    telemetry.shutdown()


def named_span(traceparent: str) -> tuple[str, str]:
    """(trace id, span id) of a sampled W3C traceparent."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    assert int(flags, 16) & 1, "sampled"
    return trace_id, span_id


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def send_spans(telemetry: Telemetry, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    telemetry.force_flush()
    return [span for span in exporter.get_finished_spans() if span.name == "outbox.send"]


def test_sends_are_counted_by_task_queue_and_kind(
    measured_relay: Relay, rows: Rows, queues: Queues, telemetry: Telemetry
) -> None:
    url = queues.create("alpha")
    dlq_url = queues.create_dead_letters()
    rows.queued_tasks("alpha", 2)
    rows.dead_task("alpha")
    rows.queued_tasks("ghost", 1)  # its SQS queue does not exist: the send fails

    assert measured_relay.run_once() == RelayBatch(
        claimed=4, sent=2, dead_letters_sent=1, failed=1, more=False
    )
    queues.receive(url, 2)
    queues.receive(dlq_url, 1)

    lines = metric_lines(telemetry)
    assert {
        'taskplat_sqs_sent_total{kind="enqueue_task",queue="alpha"} 2.0',
        'taskplat_sqs_sent_total{kind="dead_letter",queue="alpha"} 1.0',
        'taskplat_sqs_send_errors_total{kind="enqueue_task",queue="ghost"} 1.0',
        'taskplat_outbox_relayed_total{kind="enqueue_task"} 2.0',
        'taskplat_outbox_relayed_total{kind="dead_letter"} 1.0',
    } <= lines
    assert not any(line.startswith("taskplat_sqs_sent_total") and "ghost" in line for line in lines)


def test_the_send_span_joins_the_rows_trace_and_the_message_names_it(
    measured_relay: Relay,
    rows: Rows,
    queues: Queues,
    telemetry: Telemetry,
    exporter: InMemorySpanExporter,
) -> None:
    url = queues.create("traced")
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    [traced] = rows.queued_tasks(
        "traced", trace_context={"traceparent": traceparent, "tracestate": "vendor=1"}
    )
    [untraced] = rows.queued_tasks("traced")

    assert measured_relay.run_once().sent == 2

    spans = {attrs(span)["taskplat.task_id"]: span for span in send_spans(telemetry, exporter)}
    assert set(spans) == {str(traced), str(untraced)}
    span = spans[str(traced)]
    assert span.kind is SpanKind.PRODUCER
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_ID
    assert attrs(span)["messaging.destination.name"] == queues.name("traced")
    assert span.status.status_code is StatusCode.UNSET
    # A row without a stored context starts a new trace at the relay.
    fresh = spans[str(untraced)]
    assert fresh.parent is None
    assert fresh.context.trace_id != span.context.trace_id

    by_task = {task_ids_of([m])[0]: m for m in queues.receive(url, 2)}
    attributes = by_task[traced]["MessageAttributes"]
    assert named_span(attributes["traceparent"]["StringValue"]) == (
        TRACE_ID,
        f"{span.context.span_id:016x}",
    )
    assert attributes["tracestate"]["StringValue"] == "vendor=1"
    assert named_span(by_task[untraced]["MessageAttributes"]["traceparent"]["StringValue"]) == (
        f"{fresh.context.trace_id:032x}",
        f"{fresh.context.span_id:016x}",
    )


def test_a_failed_send_ends_its_span_with_the_error(
    measured_relay: Relay,
    rows: Rows,
    queues: Queues,
    telemetry: Telemetry,
    exporter: InMemorySpanExporter,
) -> None:
    [task_id] = rows.queued_tasks(
        "ghost", trace_context={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    )

    assert measured_relay.run_once().failed == 1

    [span] = send_spans(telemetry, exporter)
    assert attrs(span)["taskplat.task_id"] == str(task_id)
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == f"SQS queue {queues.name('ghost')} does not exist"
    assert 'taskplat_sqs_send_errors_total{kind="enqueue_task",queue="ghost"} 1.0' in metric_lines(
        telemetry
    )
