"""The reaper's metrics and transition log events.

Invariants: counts and log events come only after the step's transaction committed; counters are
added once per label set of a batch (grouped rows); labels never carry a task id.
  * every timed-out attempt counts in `taskplat.leases.expired` or `taskplat.deadlines.exceeded`
    {queue,operator} and, like the dispatcher's reported failures, in
    `taskplat.tasks.failed{queue,operator,reason=LeaseExpired|DeadlineExceeded}`; one that used up
    the attempt budget also counts in `taskplat.tasks.dead{reason=AttemptsExhausted}`;
  * an expired task counts in `taskplat.tasks.expired` and `taskplat.tasks.dead{reason=Expired}`;
  * pruned rows count in `taskplat.tasks.pruned` and `taskplat.outbox.pruned` (no labels).
Log events, exactly one per transition, with `task_id`, `attempt`, `queue`, `operator`, `status`
and `worker_id` when the attempt had one: `task_lease_expired` / `task_deadline_exceeded` (Failed,
a retry at `next_retry_at`), `task_dead` (a timeout used up the budget: `reason`
AttemptsExhausted, `cause` LeaseExpired or DeadlineExceeded) and `task_expired` (Dead, `reason`
Expired). Without a `Telemetry` the counters are skipped and the log events remain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from taskplat.common.logging import get_logger
from taskplat.common.telemetry import Telemetry
from taskplat.reaper.metric_specs import (
    DEADLINES_EXCEEDED,
    LEASES_EXPIRED,
    OUTBOX_PRUNED,
    TASKS_DEAD,
    TASKS_EXPIRED,
    TASKS_FAILED,
    TASKS_PRUNED,
)

Row = dict[str, Any]
TimeoutKind = Literal["lease", "deadline"]

_TIMEOUT_EVENT: dict[TimeoutKind, str] = {
    "lease": "task_lease_expired",
    "deadline": "task_deadline_exceeded",
}
_TIMEOUT_REASON: dict[TimeoutKind, str] = {"lease": "LeaseExpired", "deadline": "DeadlineExceeded"}
QUEUE_OPERATOR = {"queue": "queue", "operator": "operator"}


def add_grouped(
    counter: Any, rows: Sequence[Row], columns: Mapping[str, str], **fixed: str
) -> None:
    """`counter.add(n, labels)` once per distinct label set among `rows`; `columns` maps each
    label to the row column holding its value, `fixed` labels are the same for every row."""
    names = tuple(columns)
    groups = Counter(tuple(str(row[columns[name]]) for name in names) for row in rows)
    for values, count in groups.items():
        counter.add(count, {**dict(zip(names, values, strict=True)), **fixed})


class _Counters:
    def __init__(self, telemetry: Telemetry) -> None:
        self.failed = telemetry.counter(TASKS_FAILED)
        self.dead = telemetry.counter(TASKS_DEAD)
        self.leases_expired = telemetry.counter(LEASES_EXPIRED)
        self.deadlines_exceeded = telemetry.counter(DEADLINES_EXCEEDED)
        self.expired = telemetry.counter(TASKS_EXPIRED)
        self.tasks_pruned = telemetry.counter(TASKS_PRUNED)
        self.outbox_pruned = telemetry.counter(OUTBOX_PRUNED)


class ReaperMetrics:
    def __init__(self, telemetry: Telemetry | None) -> None:
        self._log = get_logger().bind(loop="reaper")
        self._counters = _Counters(telemetry) if telemetry is not None else None

    def timed_out(self, kind: TimeoutKind, rows: Sequence[Row]) -> None:
        """Log and count committed lease (or deadline) timeouts."""
        if not rows:
            return
        cause = _TIMEOUT_REASON[kind]
        for row in rows:
            if row["status"] == "Dead":
                self._log.info(
                    "task_dead", reason=row["dead_reason"], cause=cause, **_task_fields(row)
                )
            else:
                retry_at = row.get("next_retry_at")
                self._log.info(
                    _TIMEOUT_EVENT[kind],
                    reason=cause,
                    next_retry_at=retry_at.isoformat() if retry_at is not None else None,
                    **_task_fields(row),
                )
        if self._counters is None:
            return
        counters = self._counters
        timeouts = counters.leases_expired if kind == "lease" else counters.deadlines_exceeded
        add_grouped(timeouts, rows, QUEUE_OPERATOR)
        add_grouped(counters.failed, rows, QUEUE_OPERATOR, reason=cause)
        dead = [row for row in rows if row["status"] == "Dead"]
        add_grouped(counters.dead, dead, {**QUEUE_OPERATOR, "reason": "dead_reason"})

    def expired(self, rows: Sequence[Row]) -> None:
        """Log and count committed expiries (each task became Dead, reason Expired)."""
        if not rows:
            return
        for row in rows:
            self._log.info(
                "task_expired",
                reason=row["dead_reason"],
                expired_from=row["expired_from"],
                **_task_fields(row),
            )
        if self._counters is not None:
            add_grouped(self._counters.expired, rows, QUEUE_OPERATOR)
            add_grouped(self._counters.dead, rows, {**QUEUE_OPERATOR, "reason": "dead_reason"})

    def pruned(self, *, tasks: int = 0, outbox: int = 0) -> None:
        if self._counters is None:
            return
        if tasks:
            self._counters.tasks_pruned.add(tasks)
        if outbox:
            self._counters.outbox_pruned.add(outbox)


def _task_fields(row: Row) -> dict[str, Any]:
    """The identifying log fields of a moved task (worker_id only when the attempt had one)."""
    fields: dict[str, Any] = {
        "task_id": str(row["task_id"]),
        "attempt": row["attempt"],
        "queue": row["queue"],
        "operator": row["operator"],
        "status": row["status"],
    }
    if row.get("worker_id"):
        fields["worker_id"] = row["worker_id"]
    return fields
