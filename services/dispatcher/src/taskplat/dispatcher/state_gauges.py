"""Gauges of the platform's current state, read from Postgres for the dispatcher's /metrics.

Invariants:
  * At most one reading of `metrics.sql` per `metrics_cache_seconds` (concurrent scrapes share
    one), taken in the async /metrics handler before rendering; the observable gauge callbacks
    only read the cached snapshot (they run inside the synchronous Prometheus collection).
  * A series, once reported, keeps being reported (0, or age 0) when its rows are gone, so a
    drained queue reads 0 instead of vanishing; both outbox kinds are always reported.
  * A failed or slow reading (Postgres down) drops the gauges from the exposition until a reading
    succeeds (no stale numbers), logs `metrics_refresh_failed`, and never fails the scrape: the
    process's own counters and histograms are still served.
  * Every dispatcher replica reports the same values: aggregate them with max(), never sum().
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from opentelemetry.metrics import CallbackOptions, Observation
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from taskplat.common.clock import Clock
from taskplat.common.logging import get_logger
from taskplat.common.telemetry import Telemetry
from taskplat.dispatcher.metric_specs import (
    OUTBOX_OLDEST_AGE,
    OUTBOX_PENDING,
    QUEUE_OLDEST_AGE,
    QUEUE_RUNNING,
    QUEUES_SQS_MISSING,
    TASKS_CURRENT,
    TASKS_DEAD_LAST_HOUR,
    WORKERS_SEEN,
)
from taskplat.dispatcher.repository.access import workers_per_queue
from taskplat.dispatcher.repository.metrics import GaugeRows, read_gauges
from taskplat.dispatcher.repository.queues import sqs_missing_queues

REFRESH_TIMEOUT_SECONDS = 5.0
OUTBOX_KINDS = ("enqueue_task", "dead_letter", "route_event", "invoke_lambda")

Labels = tuple[str, ...]


@dataclass
class _Series:
    """The values of one gauge by label values, remembering every label set ever reported."""

    names: tuple[str, ...]
    values: dict[Labels, float] = field(default_factory=dict)
    seen: set[Labels] = field(default_factory=set)

    def replace(self, fresh: dict[Labels, float]) -> None:
        self.seen.update(fresh)
        self.values = {key: fresh.get(key, 0.0) for key in self.seen}

    def clear(self) -> None:
        self.values = {}

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(value, dict(zip(self.names, key, strict=True)))
            for key, value in self.values.items()
        ]


class StateGauges:
    """The cached Postgres-derived gauges of one dispatcher process."""

    def __init__(
        self,
        telemetry: Telemetry,
        pool: AsyncConnectionPool[AsyncConnection[DictRow]],
        clock: Clock,
        *,
        cache_seconds: float,
        worker_lost_seconds: float = 60.0,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._worker_lost_seconds = worker_lost_seconds
        self._read_at: float | None = None
        self._lock = asyncio.Lock()
        self.tasks_current = _Series(("queue", "status"))
        self.queue_oldest_age = _Series(("queue",))
        self.outbox_pending = _Series(("kind",))
        self.outbox_oldest_age = _Series(())
        self.dead_last_hour = _Series(("queue", "reason"))
        self.workers_seen = _Series(("queue",))
        self.sqs_missing = _Series(())
        self.queue_running = _Series(("queue",))
        gauge = telemetry.observable_gauge
        gauge(TASKS_CURRENT, [self.tasks_current.observe])
        gauge(QUEUE_OLDEST_AGE, [self.queue_oldest_age.observe])
        gauge(OUTBOX_PENDING, [self.outbox_pending.observe])
        gauge(OUTBOX_OLDEST_AGE, [self.outbox_oldest_age.observe])
        gauge(TASKS_DEAD_LAST_HOUR, [self.dead_last_hour.observe])
        gauge(QUEUES_SQS_MISSING, [self.sqs_missing.observe])
        gauge(QUEUE_RUNNING, [self.queue_running.observe])
        gauge(WORKERS_SEEN, [self.workers_seen.observe])

    def _fresh(self) -> bool:
        return self._read_at is not None and (
            time.monotonic() - self._read_at < self._cache_seconds
        )

    async def refresh(self) -> None:
        """Read the gauges again unless the cached reading is recent enough."""
        if self._fresh():
            return
        async with self._lock:
            if self._fresh():  # another scrape read them while this one waited
                return
            try:
                async with asyncio.timeout(REFRESH_TIMEOUT_SECONDS):
                    async with self._pool.connection() as conn:
                        rows = await read_gauges(conn, self._clock.sql_now())
                        workers = await workers_per_queue(
                            conn,
                            seen_within_seconds=self._worker_lost_seconds,
                            now=self._clock.sql_now(),
                        )
                        sqs_missing = await sqs_missing_queues(conn)
            except Exception as exc:  # Postgres down or slow: serve the process metrics only
                get_logger().warning("metrics_refresh_failed", error=type(exc).__name__)
                for series in self._all():
                    series.clear()
                self._read_at = None
                return
            self._apply(rows)
            self.workers_seen.replace({(row["queue"],): float(row["workers"]) for row in workers})
            self.sqs_missing.replace({(): float(sqs_missing)})
            self._read_at = time.monotonic()

    def _all(self) -> tuple[_Series, ...]:
        return (
            self.tasks_current,
            self.queue_oldest_age,
            self.outbox_pending,
            self.outbox_oldest_age,
            self.dead_last_hour,
            self.workers_seen,
            self.sqs_missing,
            self.queue_running,
        )

    def _apply(self, rows: GaugeRows) -> None:
        self.tasks_current.replace(
            {(row["queue"], row["status"]): float(row["tasks"]) for row in rows.tasks}
        )
        self.queue_running.replace(
            {
                (row["queue"],): float(row["tasks"])
                for row in rows.tasks
                if row["status"] == "Running"
            }
        )
        self.queue_oldest_age.replace(
            {
                (row["queue"],): float(row["oldest_age"])
                for row in rows.tasks
                if row["status"] == "Queued"
            }
        )
        pending = {(row["kind"],): float(row["pending"]) for row in rows.outbox}
        self.outbox_pending.replace({(kind,): pending.get((kind,), 0.0) for kind in OUTBOX_KINDS})
        oldest = max((float(row["oldest_age"]) for row in rows.outbox), default=0.0)
        self.outbox_oldest_age.replace({(): oldest})
        self.dead_last_hour.replace(
            {(row["queue"], row["reason"]): float(row["tasks"]) for row in rows.dead_last_hour}
        )
