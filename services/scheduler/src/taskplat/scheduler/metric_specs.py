"""The metrics of the scheduler: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

TASKS_PROMOTED = Metric(
    "taskplat.tasks.promoted",
    "counter",
    "Scheduled tasks that became due and were queued.",
    labels=("queue", "operator"),
    doc="Delayed tasks that became due.",
)

TASKS_RETRIED = Metric(
    "taskplat.tasks.retried",
    "counter",
    "Failed tasks queued again for their next attempt.",
    labels=("queue", "operator"),
)

SCHEDULES_RUNS_STARTED = Metric(
    "taskplat.schedules.runs_started",
    "counter",
    "Runs of scheduled jobs started (one per job and cron tick).",
    labels=("queue", "operator"),
    doc="Runs of scheduled jobs started (one per job and tick).",
)

TASKS_REPUBLISHED = Metric(
    "taskplat.tasks.republished",
    "counter",
    "Fresh wake-ups written for Queued tasks nobody claimed.",
    labels=("queue",),
    doc=(
        "Fresh wake-ups for Queued tasks nobody claimed (a lost SQS message, or no worker for the "
        "queue); a queue with a Running task gets at most `TASKPLAT_SCHEDULER_REPUBLISH_BUSY_LIMIT`"
        " per requeue period and replica, an idle queue all its stale tasks."
    ),
)

METRICS: tuple[Metric, ...] = (
    TASKS_PROMOTED,
    TASKS_RETRIED,
    SCHEDULES_RUNS_STARTED,
    TASKS_REPUBLISHED,
)
