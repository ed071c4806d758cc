"""The metrics of the dispatcher: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

CLAIMS_WAITING = Metric(
    "taskplat.claims.waiting",
    "observable_gauge",
    "task-claim-next calls now waiting for a task of the queue (wait_seconds).",
    labels=("queue",),
    doc=(
        "`task-claim-next` calls now waiting on this dispatcher for a task of the queue (a wrapper "
        'with free slots keeps one open: see "Waiting claims" in ARCHITECTURE.md); sum over '
        "dispatchers."
    ),
)

TASKS_CREATED = Metric(
    "taskplat.tasks.created",
    "counter",
    "Tasks created.",
    labels=("queue", "operator"),
    doc="Tasks accepted by `POST /tasks` (idempotent repeats not counted).",
)

TASKS_CLAIMED = Metric(
    "taskplat.tasks.claimed",
    "counter",
    "Attempts started.",
    labels=("queue", "operator"),
    doc="Attempts started (Queued -> Running).",
)

TASKS_COMPLETED = Metric(
    "taskplat.tasks.completed",
    "counter",
    "Attempts that completed their task.",
    labels=("queue", "operator"),
    doc="Attempts that completed the task.",
)

TASKS_FAILED = Metric(
    "taskplat.tasks.failed",
    "counter",
    "Attempts that failed.",
    labels=("queue", "operator", "reason"),
    doc=(
        "Attempts that failed (`Reported`, `Drained`), counted once per attempt, whether a retry "
        "follows or the task dies."
    ),
)

TASKS_DEAD = Metric(
    "taskplat.tasks.dead",
    "counter",
    "Tasks that became Dead.",
    labels=("queue", "operator", "reason"),
    doc=(
        "Tasks that became Dead (`AttemptsExhausted`, `ProcessingAttemptsExceeded`, "
        "`PermanentFailure`)."
    ),
)

TASKS_CANCELED = Metric(
    "taskplat.tasks.canceled",
    "counter",
    "Tasks canceled.",
    labels=("queue", "operator"),
)

TASKS_REPLAYED = Metric(
    "taskplat.tasks.replayed",
    "counter",
    "Tasks replayed.",
    labels=("queue", "operator"),
    doc="Dead or Canceled tasks replayed.",
)

CLAIMS_NOT_CLAIMED = Metric(
    "taskplat.claims.not_claimed",
    "counter",
    "Claims answered NotClaimed.",
    labels=("reason",),
    doc=(
        "Claims answered `NotClaimed` (`AlreadyRunning`, `Completed`, `Canceled`, `NotFound`, "
        "`NotQueued`): duplicate or late wake-ups; `Paused`: a wake-up of a paused queue, consumed "
        "(the resume re-announces the task)."
    ),
)

CLAIMS_LIMITED = Metric(
    "taskplat.claims.limited",
    "counter",
    (
        "Claims a limit of the queue held back (`reason`: ConcurrencyLimited, KeyConcurrencyLimited"
        " or RateLimited; a waiting claim counts each time it waits for one)."
    ),
    labels=("queue", "reason"),
    doc=(
        "Claims a limit of the queue held back: `reason` is `ConcurrencyLimited`, "
        "`KeyConcurrencyLimited` or `RateLimited` (docs/flow-control.md). The task stays Queued; a "
        "steady rate says the limit binds."
    ),
)

WORKER_CALLS_REJECTED = Metric(
    "taskplat.worker_calls.rejected",
    "counter",
    "Stale worker calls refused.",
    labels=("route", "reason"),
    doc=(
        "Stale worker calls refused (`StaleAttempt`, `StaleLease`, `NotRunning`, `Canceled`, "
        "`NotCanceled`, `NotFound`)."
    ),
)

HEARTBEATS = Metric(
    "taskplat.heartbeats",
    "counter",
    "Accepted heartbeats.",
    labels=("queue",),
)

EVENTS_RECEIVED = Metric(
    "taskplat.events.received",
    "counter",
    "Events stored (a repeat of a stored event is not counted).",
    doc="Events stored from workers (mid-task or with a completion; repeats not counted).",
)

DAGS_APPLIED = Metric(
    "taskplat.dags.applied",
    "counter",
    "DAG documents applied that changed a DAG.",
)

QUEUE_PAUSES = Metric(
    "taskplat.queue.pauses",
    "counter",
    "Queues paused or resumed (`action`).",
    labels=("queue", "action"),
    doc=(
        "Queues paused or resumed (`PUT /queues/{queue}/pause`, `/resume`); repeats that change "
        "nothing are not counted."
    ),
)

BULK_REPLAYS = Metric(
    "taskplat.bulk_replays",
    "counter",
    "Bulk replay calls (`by`: ids or filter).",
    labels=("by",),
    doc=(
        "`POST /tasks/retry` calls (each task they replay also counts in "
        "`taskplat_tasks_replayed_total`)."
    ),
)

TASK_SCHEDULE_LAG = Metric(
    "taskplat.task.schedule_lag",
    "histogram",
    "Claim time minus the time the task became Queued.",
    labels=("queue",),
    unit="s",
    doc="Claim time minus the time the task became Queued (creation, promotion or retry).",
)

TASK_ENQUEUE_TO_START = Metric(
    "taskplat.task.enqueue_to_start",
    "histogram",
    "First claim of a task minus its creation.",
    labels=("queue",),
    unit="s",
)

TASK_RUN_TIME = Metric(
    "taskplat.task.run_time",
    "histogram",
    "Completion minus the attempt's start.",
    labels=("queue", "operator", "outcome"),
    unit="s",
)

TASKS_CURRENT = Metric(
    "taskplat.tasks.current",
    "observable_gauge",
    "Tasks now Scheduled, Queued, Running or Failed (retry pending).",
    labels=("queue", "status"),
)

QUEUE_OLDEST_AGE = Metric(
    "taskplat.queue.oldest_age",
    "observable_gauge",
    "Seconds since the oldest Queued task of the queue became Queued.",
    labels=("queue",),
    unit="s",
    doc="Age of the oldest Queued task (since it became Queued).",
)

OUTBOX_PENDING = Metric(
    "taskplat.outbox.pending",
    "observable_gauge",
    "Outbox rows not yet sent to SQS.",
    labels=("kind",),
    doc=(
        "Outbox rows not yet handled, by kind: `enqueue_task` (SQS wake-ups), `dead_letter`, "
        "`route_event` (a dataset event to route), `invoke_lambda` (a Lambda job's invocation)."
    ),
)

OUTBOX_OLDEST_AGE = Metric(
    "taskplat.outbox.oldest_age",
    "observable_gauge",
    "Seconds since the oldest pending outbox row was written.",
    unit="s",
    doc=(
        "Age of the oldest pending outbox row; a wake-up the relay held back (see "
        "`taskplat_outbox_held_total`) counts only from when it came due again."
    ),
)

TASKS_DEAD_LAST_HOUR = Metric(
    "taskplat.tasks.dead_last_hour",
    "observable_gauge",
    "Tasks that became Dead in the last hour, by reason.",
    labels=("queue", "reason"),
)

QUEUES_SQS_MISSING = Metric(
    "taskplat.queues.sqs_missing",
    "observable_gauge",
    (
        "Queues the relay holds because their SQS queue does not exist: none of their wake-ups is "
        "sent until a probe finds it (docs/operations.md)."
    ),
    doc=(
        "Task queues the relay holds because their SQS queue does not exist (see [Task queues, and "
        "a held queue](../operations.md#task-queues-and-a-held-queue))."
    ),
)

QUEUE_RUNNING = Metric(
    "taskplat.queue.running",
    "observable_gauge",
    (
        "Tasks of the queue Running now, across all workers (what its `concurrency_limit` bounds, "
        "docs/flow-control.md)."
    ),
    labels=("queue",),
    doc="Tasks of the queue Running now, across all workers (what `concurrency_limit` bounds).",
)

WORKERS_SEEN = Metric(
    "taskplat.workers.seen",
    "observable_gauge",
    "Workers of the queue that reported within `worker_lost_seconds`.",
    labels=("queue",),
    doc=(
        "Workers serving the queue that reported within `TASKPLAT_DISPATCHER_WORKER_LOST_SECONDS` "
        "(see [Access, the audit log and "
        "workers](../operations.md#access-the-audit-log-and-workers))."
    ),
)

METRICS: tuple[Metric, ...] = (
    CLAIMS_WAITING,
    TASKS_CREATED,
    TASKS_CLAIMED,
    TASKS_COMPLETED,
    TASKS_FAILED,
    TASKS_DEAD,
    TASKS_CANCELED,
    TASKS_REPLAYED,
    CLAIMS_NOT_CLAIMED,
    CLAIMS_LIMITED,
    WORKER_CALLS_REJECTED,
    HEARTBEATS,
    EVENTS_RECEIVED,
    DAGS_APPLIED,
    QUEUE_PAUSES,
    BULK_REPLAYS,
    TASK_SCHEDULE_LAG,
    TASK_ENQUEUE_TO_START,
    TASK_RUN_TIME,
    TASKS_CURRENT,
    QUEUE_OLDEST_AGE,
    OUTBOX_PENDING,
    OUTBOX_OLDEST_AGE,
    TASKS_DEAD_LAST_HOUR,
    QUEUES_SQS_MISSING,
    QUEUE_RUNNING,
    WORKERS_SEEN,
)
