"""The metrics of the sink: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

SINK_RECORDS_WRITTEN = Metric(
    "taskplat.sink.records_written",
    "counter",
    "Rows the sink inserted.",
    doc="Rows inserted into dataset tables.",
)

SINK_DUPLICATES_SKIPPED = Metric(
    "taskplat.sink.duplicates_skipped",
    "counter",
    "Records skipped: their (org_id, dedupe_key) was already written.",
    doc="Records whose `(org_id, dedupe_key)` was already written (`ON CONFLICT DO NOTHING`).",
)

SINK_DEAD_LETTERED = Metric(
    "taskplat.sink.dead_lettered",
    "counter",
    "Buffer messages moved to the DLQ, by reason.",
    labels=("reason",),
    doc=(
        "Buffer messages moved to the buffer's DLQ: `MalformedMessage`, `UnknownDataset`, "
        "`SchemaMismatch`, `MalformedRecord`, `RejectedByDatabase` (also the message attribute "
        "`reason` in the DLQ)."
    ),
)

SINK_EVENTS = Metric(
    "taskplat.sink.events",
    "counter",
    "Dataset events the sink stored.",
    doc="Dataset events stored (one per write that inserted rows).",
)

SINK_BUFFER_AGE = Metric(
    "taskplat.sink.buffer_age",
    "histogram",
    "Seconds from a message sent to the buffer to its records written.",
    unit="s",
)

SINK_BUFFER_MESSAGES = Metric(
    "taskplat.sink.buffer_messages",
    "observable_gauge",
    "Messages waiting in the buffer queues (summed).",
    doc=(
        "Messages waiting in the buffer queues, summed (ApproximateNumberOfMessages, read every "
        "`discovery_interval_seconds`); the sink's ECS service scales on it."
    ),
)

METRICS: tuple[Metric, ...] = (
    SINK_RECORDS_WRITTEN,
    SINK_DUPLICATES_SKIPPED,
    SINK_DEAD_LETTERED,
    SINK_EVENTS,
    SINK_BUFFER_AGE,
    SINK_BUFFER_MESSAGES,
)
