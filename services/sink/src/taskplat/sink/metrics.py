"""The sink's metrics.

Invariants (all counted once the write's transaction committed, or the DLQ accepted the message):
  * `taskplat.sink.records_written` rows inserted, `taskplat.sink.duplicates_skipped` records whose
    (org_id, dedupe_key) was already in the table (ON CONFLICT DO NOTHING);
  * `taskplat.sink.dead_lettered{reason}` messages moved to a buffer's DLQ, by reason;
  * `taskplat.sink.events` dataset events stored (one per write that inserted rows);
  * histogram `taskplat.sink.buffer_age` seconds from a message's SentTimestamp to its write;
  * gauge `taskplat.sink.buffer_messages` (`taskplat_sink_buffer_messages` on /metrics): messages
    waiting in the buffer queues (ApproximateNumberOfMessages, summed), as of the last discovery.
    The ECS service scales on it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from taskplat.common.telemetry import Telemetry
from taskplat.sink.metric_specs import (
    SINK_BUFFER_AGE,
    SINK_BUFFER_MESSAGES,
    SINK_DEAD_LETTERED,
    SINK_DUPLICATES_SKIPPED,
    SINK_EVENTS,
    SINK_RECORDS_WRITTEN,
)


class SinkMetrics:
    def __init__(self, telemetry: Telemetry | None) -> None:
        self._lock = threading.Lock()
        self._waiting = 0
        self._written: Any = None
        self._duplicates: Any = None
        self._dead: Any = None
        self._events: Any = None
        self._age: Any = None
        if telemetry is None:
            return
        self._written = telemetry.counter(SINK_RECORDS_WRITTEN)
        self._duplicates = telemetry.counter(SINK_DUPLICATES_SKIPPED)
        self._dead = telemetry.counter(SINK_DEAD_LETTERED)
        self._events = telemetry.counter(SINK_EVENTS)
        self._age = telemetry.histogram(SINK_BUFFER_AGE)
        telemetry.observable_gauge(SINK_BUFFER_MESSAGES, [self._observe])

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(self._waiting)]

    def buffer_messages(self, waiting: int) -> None:
        with self._lock:
            self._waiting = waiting

    def written(self, inserted: int, duplicates: int, events: int) -> None:
        if self._written is None:
            return
        self._written.add(inserted)
        self._duplicates.add(duplicates)
        self._events.add(events)

    def dead_lettered(self, reason: str) -> None:
        if self._dead is not None:
            self._dead.add(1, {"reason": reason})

    def buffer_age(self, seconds: float) -> None:
        if self._age is not None:
            self._age.record(max(0.0, seconds))
