"""The scheduler's metrics and transition log events.

Invariants: one counter per kind of transition (`taskplat.tasks.promoted{queue,operator}`,
`taskplat.tasks.retried{queue,operator}`, `taskplat.tasks.republished{queue}`,
`taskplat.schedules.runs_started{queue,operator}`), added only after the
step's transaction committed, grouped per label set so a batch costs one `add` per (queue,
operator); labels never carry a task id. Each moved task gets one log event (`task_promoted`,
`task_retried`, `task_republished`, `scheduled_run_started`) with `task_id`, `attempt`, `queue`
and `operator`. Without a `Telemetry` the counters are skipped and the log events remain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from taskplat.common.logging import get_logger
from taskplat.common.telemetry import Telemetry
from taskplat.scheduler.metric_specs import (
    SCHEDULES_RUNS_STARTED,
    TASKS_PROMOTED,
    TASKS_REPUBLISHED,
    TASKS_RETRIED,
)

Row = dict[str, Any]

PROMOTED = "task_promoted"
RETRIED = "task_retried"
REPUBLISHED = "task_republished"
RUN_STARTED = "scheduled_run_started"


def add_grouped(counter: Any, rows: Sequence[Row], labels: Sequence[str]) -> None:
    """`counter.add(n, {label: value})` once per distinct label set among `rows`."""
    groups = Counter(tuple(str(row[label]) for label in labels) for row in rows)
    for values, count in groups.items():
        counter.add(count, dict(zip(labels, values, strict=True)))


class SchedulerMetrics:
    def __init__(self, telemetry: Telemetry | None) -> None:
        self._log = get_logger().bind(loop="scheduler")
        self._counters: dict[str, tuple[Any, tuple[str, ...]]] = {}
        if telemetry is None:
            return
        self._counters = {
            PROMOTED: (
                telemetry.counter(TASKS_PROMOTED),
                ("queue", "operator"),
            ),
            RETRIED: (
                telemetry.counter(TASKS_RETRIED),
                ("queue", "operator"),
            ),
            RUN_STARTED: (
                telemetry.counter(SCHEDULES_RUNS_STARTED),
                ("queue", "operator"),
            ),
            REPUBLISHED: (
                telemetry.counter(TASKS_REPUBLISHED),
                ("queue",),
            ),
        }

    def moved(self, event: str, rows: Sequence[Row]) -> None:
        """Log and count the committed transition `event` of each task in `rows`."""
        if not rows:
            return
        for row in rows:
            self._log.info(
                event,
                task_id=str(row["task_id"]),
                attempt=row["attempt"],
                queue=row["queue"],
                operator=row["operator"],
            )
        if event in self._counters:
            counter, labels = self._counters[event]
            add_grouped(counter, rows, labels)
