"""The relay's metrics and its `outbox.send` spans.

Invariants:
  * every claimed row not held gets one span "outbox.send" (kind PRODUCER) whose parent is the
    row's stored W3C context (`extract(row.trace_context)`; a row without one starts a new trace),
    and the SQS message carries `inject()` of that span, so the relay is a link of the task's
    trace. With
    tracing off the span is the row's own (non-recording) context, so the row's context is
    forwarded unchanged and costs nothing;
  * each span ends exactly once, with status ERROR and the reason when its row was not sent;
  * counters, labelled by the row's task `queue` and outbox `kind` (never a task id):
    `taskplat.sqs.sent{queue,kind}` messages SQS accepted, `taskplat.sqs.send_errors{queue,kind}`
    rows whose send failed for any reason (SQS refused or unreachable, missing queue, unsendable
    row), `taskplat.outbox.relayed{kind}` rows that left the outbox (sent, or skipped because the
    task was no longer Queued), `taskplat.outbox.skipped{kind}` the skipped ones,
    `taskplat.outbox.held{kind}` wake-ups held back (still pending: one row counts each time it is
    held), `taskplat.outbox.deferred{queue}` wake-ups deferred because their queue is held for
    its missing SQS queue (`missing_queues`; a deferred row gets no span); all counted only once
    the batch committed. A skipped row's span carries
    `taskplat.outbox.skipped = true`; a held row gets no span (it is not sent now);
  * routing (`route_event` rows, counted once their batch committed):
    `taskplat.events.routed{outcome}` events decided (`routed`, `NotCurrentVersion`,
    `UnknownDataset`), `taskplat.events.tasks_created` downstream tasks created, and the
    histogram `taskplat.events.routing_lag` (seconds from the event stored to its downstream
    tasks created);
  * `taskplat.sqs.requests{op}` counts every API call of the relay's SQS client once (botocore's
    `before-call` event, so a call retried inside botocore counts once), `op` being the snake_case
    operation name: `send_message_batch` (one per SendMessageBatch call), `get_queue_url`, ...
    The worker wrapper counts its own calls under the same name, so requests per task add up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from botocore import xform_name
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from taskplat.common.sqs_wire import WireSqs
from taskplat.common.telemetry import Telemetry, extract, inject
from taskplat.outbox_relay.metric_specs import (
    EVENTS_ROUTED,
    EVENTS_ROUTING_LAG,
    EVENTS_TASKS_CREATED,
    OUTBOX_DEFERRED,
    OUTBOX_HELD,
    OUTBOX_RELAYED,
    OUTBOX_SKIPPED,
    SQS_REQUESTS,
    SQS_SEND_ERRORS,
    SQS_SENT,
)
from taskplat.outbox_relay.outbox import OutboxRow
from taskplat.outbox_relay.routing import RoutedEvent

SPAN_NAME = "outbox.send"


class RelayMetrics:
    def __init__(self, telemetry: Telemetry | None) -> None:
        self._tracer: trace.Tracer = (
            telemetry.tracer if telemetry is not None else trace.NoOpTracer()
        )
        self._sent: Any = None
        self._errors: Any = None
        self._relayed: Any = None
        self._skipped: Any = None
        self._held: Any = None
        self._deferred: Any = None
        self._requests: Any = None
        self._routed: Any = None
        self._routed_tasks: Any = None
        self._routing_lag: Any = None
        if telemetry is not None:
            self._routed = telemetry.counter(EVENTS_ROUTED)
            self._routed_tasks = telemetry.counter(EVENTS_TASKS_CREATED)
            self._routing_lag = telemetry.histogram(EVENTS_ROUTING_LAG)
            self._sent = telemetry.counter(SQS_SENT)
            self._errors = telemetry.counter(SQS_SEND_ERRORS)
            self._relayed = telemetry.counter(OUTBOX_RELAYED)
            self._skipped = telemetry.counter(OUTBOX_SKIPPED)
            self._held = telemetry.counter(OUTBOX_HELD)
            self._deferred = telemetry.counter(OUTBOX_DEFERRED)
            self._requests = telemetry.counter(SQS_REQUESTS)

    def watch_sqs(self, client: Any) -> None:
        """Count every API call `client` makes in `taskplat.sqs.requests{op}` (one client per
        relay: a client shared by two relays is counted by the first one only)."""
        counter = self._requests
        if counter is None:
            return

        def before_call(*, model: Any, **_: Any) -> None:
            counter.add(1, {"op": xform_name(model.name)})

        client.meta.events.register(
            "before-call.sqs", before_call, unique_id="taskplat.sqs.requests"
        )
        if isinstance(client, WireSqs):  # its hot calls bypass botocore's hooks
            client.on_request(lambda op: counter.add(1, {"op": op}))

    def start_span(self, row: OutboxRow) -> Span:
        """The "outbox.send" span of `row`, child of the row's stored trace context."""
        return self._tracer.start_span(
            SPAN_NAME,
            context=extract(_strings(row.trace_context)),
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "aws_sqs",
                "messaging.operation.type": "send",
                "taskplat.task_id": str(row.task_id),
                "taskplat.queue": row.queue,
                "taskplat.outbox.id": row.outbox_id,
                "taskplat.outbox.kind": row.kind,
                "taskplat.outbox.send_attempt": row.send_attempts + 1,
                **({"taskplat.outbox.skipped": True} if row.skipped else {}),
            },
        )

    @staticmethod
    def carrier(span: Span) -> dict[str, str]:
        """The W3C context the message carries: the span's own (or the row's, tracing off)."""
        return inject(trace.set_span_in_context(span))

    @staticmethod
    def end_span(span: Span, error: str | None) -> None:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def sent(self, rows: Iterable[OutboxRow]) -> None:
        _add(self._sent, Counter((row.queue, row.kind) for row in rows), ("queue", "kind"))

    def failed(self, rows: Iterable[OutboxRow]) -> None:
        _add(self._errors, Counter((row.queue, row.kind) for row in rows), ("queue", "kind"))

    def skipped(self, rows: Iterable[OutboxRow]) -> None:
        _add(self._skipped, Counter((row.kind,) for row in rows), ("kind",))

    def held(self, rows: Iterable[OutboxRow]) -> None:
        _add(self._held, Counter((row.kind,) for row in rows), ("kind",))

    def deferred(self, rows: Iterable[OutboxRow]) -> None:
        _add(self._deferred, Counter((row.queue,) for row in rows), ("queue",))

    def routed(self, events: Iterable[RoutedEvent], committed_at: datetime) -> None:
        if self._routed is None:
            return
        for event in events:
            self._routed.add(1, {"outcome": event.reason or "routed"})
            if event.tasks:
                self._routed_tasks.add(len(event.tasks))
                lag = (committed_at - event.event_created_at).total_seconds()
                self._routing_lag.record(max(lag, 0.0))

    def relayed(self, rows: Iterable[OutboxRow]) -> None:
        _add(self._relayed, Counter((row.kind,) for row in rows), ("kind",))


def _add(counter: Any, groups: Counter[tuple[str, ...]], labels: tuple[str, ...]) -> None:
    if counter is None:
        return
    for values, count in groups.items():
        counter.add(count, dict(zip(labels, values, strict=True)))


def _strings(trace_context: Mapping[str, Any] | None) -> dict[str, str]:
    """The string fields of a stored trace context (anything else is ignored)."""
    if not trace_context:
        return {}
    return {key: value for key, value in trace_context.items() if isinstance(value, str)}
