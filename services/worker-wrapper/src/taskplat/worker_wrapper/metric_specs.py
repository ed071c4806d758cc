"""The metrics of the worker wrapper: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

SQS_RECEIVED = Metric(
    "taskplat.sqs.received",
    "counter",
    "SQS messages received.",
    labels=("queue",),
    doc="Messages received.",
)

SQS_DELETED = Metric(
    "taskplat.sqs.deleted",
    "counter",
    "SQS messages deleted, by why: not_claimed, completed, rejected, poison.",
    labels=("queue", "why"),
    doc="Messages deleted: `not_claimed`, `completed`, `rejected`, `poison`.",
)

SQS_REQUESTS = Metric(
    "taskplat.sqs.requests",
    "counter",
    "SQS API requests made, by op: receive, delete, delete_batch, change_visibility.",
    labels=("queue", "op"),
    doc=(
        "SQS API calls the wrapper made: `receive`, `delete`, `delete_batch`, `change_visibility`; "
        "with the tasks completed, SQS requests per task."
    ),
)

SQS_ERRORS = Metric(
    "taskplat.sqs.errors",
    "counter",
    "Failed SQS calls, by op: receive, delete, change_visibility.",
    labels=("queue", "op"),
    doc="Failed `receive`, `delete`, `change_visibility` calls.",
)

WORKER_CLAIMS = Metric(
    "taskplat.worker.claims",
    "counter",
    "Claim answers, by result: Claimed or the NotClaimed reason.",
    labels=("queue", "result"),
    doc="Claim answers (`Claimed` or the NotClaimed reason).",
)

WORKER_TASKS = Metric(
    "taskplat.worker.tasks",
    "counter",
    (
        "Claimed attempts ended, by outcome: Completed, Failed, Canceled (accepted by the "
        "dispatcher) or Stopped (no accepted report)."
    ),
    labels=("operator", "outcome"),
    doc="Tasks the wrapper finished: `Completed`, `Failed`, `Canceled`, `Stopped`.",
)

OPERATOR_STARTS = Metric(
    "taskplat.operator.starts",
    "counter",
    "Operator processes started.",
    labels=("operator", "mode"),
    doc="Operator processes started (`per-task` or `pooled`).",
)

OPERATOR_CRASHES = Metric(
    "taskplat.operator.crashes",
    "counter",
    "Operator processes that exited non-zero or without a result envelope.",
    labels=("operator",),
    doc="Operators that exited non-zero or without a result envelope.",
)

OPERATOR_KILLS = Metric(
    "taskplat.operator.kills",
    "counter",
    "Operator process groups killed by the wrapper, by reason.",
    labels=("operator", "reason"),
    doc=(
        "Operators killed: `deadline`, `canceled`, `lease_lost`, `draining`, `flood`, "
        "`protocol_error` (a malformed event or result line)."
    ),
)

DISPATCHER_CALLS = Metric(
    "taskplat.dispatcher.calls",
    "counter",
    "Dispatcher HTTP calls answered, by route and status.",
    labels=("route", "status"),
    doc="Calls to the dispatcher answered, by route and status.",
)

DISPATCHER_CALL_ERRORS = Metric(
    "taskplat.dispatcher.call_errors",
    "counter",
    "Dispatcher HTTP calls that got no answer (network errors), by route.",
    labels=("route",),
    doc="Calls to the dispatcher that got no answer (network failures), by route.",
)

OPERATOR_RUN_TIME = Metric(
    "taskplat.operator.run_time",
    "histogram",
    "Operator run time of one attempt, by outcome.",
    labels=("operator", "outcome"),
    unit="s",
    doc="Operator run time seen by the wrapper.",
)

WORKER_BUSY = Metric(
    "taskplat.worker.busy",
    "up_down_counter",
    "Claimed tasks this wrapper runs now.",
    doc="Tasks running now on this wrapper.",
)

METRICS: tuple[Metric, ...] = (
    SQS_RECEIVED,
    SQS_DELETED,
    SQS_REQUESTS,
    SQS_ERRORS,
    WORKER_CLAIMS,
    WORKER_TASKS,
    OPERATOR_STARTS,
    OPERATOR_CRASHES,
    OPERATOR_KILLS,
    DISPATCHER_CALLS,
    DISPATCHER_CALL_ERRORS,
    OPERATOR_RUN_TIME,
    WORKER_BUSY,
)
