"""Metrics and log events of the dispatcher's task transitions.

Invariants:
  * The service calls a `Recorder` method only after the transaction of the transition committed,
    so a rolled-back transition is never counted nor logged.
  * One log event per transition (`task_created`, `task_claimed`, `task_completed`, `task_failed`
    (a retry is scheduled), `task_dead`, `task_canceled`, `task_replayed`) carrying `task_id`,
    `attempt`, `queue`, `operator` and, once a worker holds the task, `worker_id`; refused worker
    calls log `worker_call_rejected` and duplicate wake-ups `claim_not_claimed` with the reason.
  * `taskplat.tasks.failed` counts every failed attempt (`reason="Reported"` here); an attempt
    that used up the budget also counts in `taskplat.tasks.dead`.
  * Labels are bounded (queue, operator, reason, outcome, route template), never a task id.
  * Durations are differences of the database timestamps of the rows (one clock), never negative.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from taskplat.common.logging import get_logger, info_events, info_lines
from taskplat.common.metric_specs import CLAIMS_REFUSED
from taskplat.common.telemetry import Telemetry
from taskplat.dispatcher.metric_specs import (
    BULK_REPLAYS,
    CLAIMS_LIMITED,
    CLAIMS_NOT_CLAIMED,
    DAGS_APPLIED,
    EVENTS_RECEIVED,
    HEARTBEATS,
    QUEUE_PAUSES,
    TASK_ENQUEUE_TO_START,
    TASK_RUN_TIME,
    TASK_SCHEDULE_LAG,
    TASKS_CANCELED,
    TASKS_CLAIMED,
    TASKS_COMPLETED,
    TASKS_CREATED,
    TASKS_DEAD,
    TASKS_FAILED,
    TASKS_REPLAYED,
    WORKER_CALLS_REJECTED,
)

Row = dict[str, Any]


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max((later - earlier).total_seconds(), 0.0)


def _task_fields(row: Row) -> dict[str, Any]:
    """The identifying log fields of a task row (worker_id only when a worker holds it)."""
    fields: dict[str, Any] = {
        "task_id": str(row["task_id"]),
        "attempt": row["attempt"],
        "queue": row["queue"],
        "operator": row["operator"],
    }
    if row.get("worker_id"):
        fields["worker_id"] = row["worker_id"]
    return fields


class Recorder:
    """Counts, times and logs each committed transition of the dispatcher."""

    def __init__(self, telemetry: Telemetry) -> None:
        counter = telemetry.counter
        self._created = counter(TASKS_CREATED)
        self._claimed = counter(TASKS_CLAIMED)
        self._completed = counter(TASKS_COMPLETED)
        self._failed = counter(TASKS_FAILED)
        self._dead = counter(TASKS_DEAD)
        self._canceled = counter(TASKS_CANCELED)
        self._replayed = counter(TASKS_REPLAYED)
        self._not_claimed = counter(CLAIMS_NOT_CLAIMED)
        self._refused = counter(CLAIMS_REFUSED)
        self._limited = counter(CLAIMS_LIMITED)
        self._rejected = counter(WORKER_CALLS_REJECTED)
        self._heartbeats = counter(HEARTBEATS)
        self._events = counter(EVENTS_RECEIVED)
        self._dags_applied = counter(DAGS_APPLIED)
        self._queue_pauses = counter(QUEUE_PAUSES)
        self._bulk_replays = counter(BULK_REPLAYS)
        self._schedule_lag = telemetry.histogram(TASK_SCHEDULE_LAG)
        self._enqueue_to_start = telemetry.histogram(TASK_ENQUEUE_TO_START)
        self._run_time = telemetry.histogram(TASK_RUN_TIME)

    # ---- public API ------------------------------------------------------------------------

    def task_created(self, row: Row) -> None:
        self._created.add(1, {"queue": row["queue"], "operator": row["operator"]})
        get_logger().info("task_created", status=row["status"], **_task_fields(row))

    def tasks_created(self, rows: list[Row]) -> None:
        """`task_created` for each row of a bulk create: the counts added once per label set,
        the lines written together (`info_lines`), the same lines as one call per row."""
        counts = Counter((row["queue"], row["operator"]) for row in rows)
        for (queue, operator), count in counts.items():
            self._created.add(count, {"queue": queue, "operator": operator})
        info_lines("task_created", [{"status": row["status"], **_task_fields(row)} for row in rows])

    def task_canceled(self, row: Row, *, by: str = "api") -> None:
        self._canceled.add(1, {"queue": row["queue"], "operator": row["operator"]})
        get_logger().info("task_canceled", by=by, **_task_fields(row))

    def events_received(self, count: int) -> None:
        if count:
            self._events.add(count)

    def dag_applied(self, dag_name: str, jobs: int) -> None:
        self._dags_applied.add(1)
        get_logger().info("dag_applied", dag_name=dag_name, jobs=jobs)

    def dag_deleted(self, dag_name: str) -> None:
        get_logger().info("dag_deleted", dag_name=dag_name)

    def task_replayed(self, row: Row) -> None:
        self._replayed.add(1, {"queue": row["queue"], "operator": row["operator"]})
        get_logger().info("task_replayed", **_task_fields(row))

    def queue_paused(self, queue: str) -> None:
        self._queue_pauses.add(1, {"queue": queue, "action": "pause"})
        get_logger().info("queue_paused", queue=queue)

    def queue_resumed(self, queue: str, announced: int) -> None:
        self._queue_pauses.add(1, {"queue": queue, "action": "resume"})
        get_logger().info("queue_resumed", queue=queue, announced=announced)

    def bulk_replay(self, replayed: int, *, by: str) -> None:
        """One bulk replay call (each task it replayed is also counted by `task_replayed`)."""
        self._bulk_replays.add(1, {"by": by})
        get_logger().info("bulk_replay", replayed=replayed, by=by)

    # ---- internal worker API ---------------------------------------------------------------

    def task_claimed(self, row: Row) -> None:
        get_logger().info("task_claimed", **self._claimed_line(row))

    def tasks_claimed(self, rows: list[Row]) -> None:
        """`task_claimed` for each row of a batch: the same lines, written together."""
        info_lines("task_claimed", [self._claimed_line(row) for row in rows])

    def _claimed_line(self, row: Row) -> dict[str, Any]:
        """Count and time a claim; the fields of its `task_claimed` line."""
        queue = row["queue"]
        self._claimed.add(1, {"queue": queue, "operator": row["operator"]})
        lag = _seconds(row["started_at"], row.get("queued_at"))
        if lag is not None:
            self._schedule_lag.record(lag, {"queue": queue})
        if row["attempt"] == 1 and row.get("replay_offset", 0) == 0:
            to_start = _seconds(row["started_at"], row.get("created_at"))
            if to_start is not None:
                self._enqueue_to_start.record(to_start, {"queue": queue})
        return {"schedule_lag_seconds": lag, **_task_fields(row)}

    def claim_not_claimed(self, task_id: object, worker_id: str, reason: str) -> None:
        self._not_claimed.add(1, {"reason": reason})
        get_logger().info(
            "claim_not_claimed", task_id=str(task_id), worker_id=worker_id, reason=reason
        )

    def claims_refused(self, task_ids: list[Any], worker_id: str, setting: str) -> None:
        """Untrusted tasks a claim left Queued for want of `setting` (capability keys)."""
        self._refused.add(len(task_ids), {"setting": setting})
        get_logger().warning(
            "claim_refused_untrusted",
            task_ids=[str(task_id) for task_id in task_ids],
            worker_id=worker_id,
            setting=setting,
        )

    def claims_limited(self, queue: str, reason: str) -> None:
        self._limited.add(1, {"queue": queue, "reason": reason})

    def heartbeat(self, row: Row) -> None:
        self._heartbeats.add(1, {"queue": row["queue"]})

    def attempt_ended(self, row: Row, outcome: str, *, late: bool = False) -> None:
        """A worker's accepted completion: `outcome` is how the attempt ended (its status, or
        `Drained`), `row` the task after."""
        event, fields = self._ended_line(row, outcome, late)
        get_logger().info(event, **fields)

    def attempts_ended(self, ended: list[tuple[Row, str, bool]]) -> None:
        """`attempt_ended` for each (row, outcome, late) of a batch: the same lines, written
        together."""
        info_events([self._ended_line(row, outcome, late) for row, outcome, late in ended])

    def _ended_line(self, row: Row, outcome: str, late: bool) -> tuple[str, dict[str, Any]]:
        """Count and time an accepted completion; the event and fields of its line."""
        queue, operator = row["queue"], row["operator"]
        labels = {"queue": queue, "operator": operator}
        run_time = _seconds(row["ended_at"], row.get("started_at"))
        if run_time is not None:
            self._run_time.record(
                run_time, {"queue": queue, "operator": operator, "outcome": outcome}
            )
        fields = {**_task_fields(row), "run_time_seconds": run_time}
        status = row["status"]
        if status == "Completed":
            self._completed.add(1, labels)
            return "task_completed", {"late": late, **fields}
        if status == "Canceled":
            self._canceled.add(1, labels)
            return "task_canceled", {"by": "worker", **fields}
        failed_reason = "Drained" if outcome == "Drained" else "Reported"
        self._failed.add(1, {**labels, "reason": failed_reason})
        if status == "Dead":
            reason = row.get("dead_reason") or "AttemptsExhausted"
            self._dead.add(1, {**labels, "reason": reason})
            return "task_dead", {"reason": reason, **fields}
        retry_at = row.get("next_retry_at")
        return "task_failed", {
            "reason": failed_reason,
            "next_retry_at": retry_at.isoformat() if retry_at else None,
            **fields,
        }

    def worker_call_rejected(self, route: str, reason: str) -> None:
        """A stale worker call (task_id and attempt are bound to the request's log context)."""
        self._rejected.add(1, {"route": route, "reason": reason})
        get_logger().info("worker_call_rejected", route=route, reason=reason)
