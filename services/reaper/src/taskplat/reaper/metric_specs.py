"""The metrics of the reaper: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

TASKS_FAILED = Metric(
    "taskplat.tasks.failed",
    "counter",
    "Attempts that failed, by reason (a retry follows unless the task died).",
    labels=("queue", "operator", "reason"),
    doc=(
        "Attempts that failed (`LeaseExpired`, `DeadlineExceeded`), counted once per attempt, "
        "whether a retry follows or the task dies."
    ),
)

TASKS_DEAD = Metric(
    "taskplat.tasks.dead",
    "counter",
    "Tasks that became Dead, by dead_reason.",
    labels=("queue", "operator", "reason"),
    doc="Tasks that became Dead (`AttemptsExhausted`, `ProcessingAttemptsExceeded`, `Expired`).",
)

LEASES_EXPIRED = Metric(
    "taskplat.leases.expired",
    "counter",
    "Running attempts whose lease ran out (a lost or stuck worker).",
    labels=("queue", "operator"),
    doc="Running attempts whose lease ran out (a crashed or stuck worker).",
)

DEADLINES_EXCEEDED = Metric(
    "taskplat.deadlines.exceeded",
    "counter",
    "Running attempts timed out past their hard deadline plus grace.",
    labels=("queue", "operator"),
    doc="Running attempts past their hard deadline plus grace.",
)

TASKS_EXPIRED = Metric(
    "taskplat.tasks.expired",
    "counter",
    "Tasks past expires_at before they started.",
    labels=("queue", "operator"),
    doc="Tasks that passed `expires_at` before they started.",
)

TASKS_PRUNED = Metric(
    "taskplat.tasks.pruned",
    "counter",
    "Finished tasks deleted after the retention.",
    doc="Finished tasks removed after their retention.",
)

OUTBOX_PRUNED = Metric(
    "taskplat.outbox.pruned",
    "counter",
    "Sent outbox rows deleted after the retention.",
    doc="Sent outbox rows removed after their retention.",
)

METRICS: tuple[Metric, ...] = (
    TASKS_FAILED,
    TASKS_DEAD,
    LEASES_EXPIRED,
    DEADLINES_EXCEEDED,
    TASKS_EXPIRED,
    TASKS_PRUNED,
    OUTBOX_PRUNED,
)
