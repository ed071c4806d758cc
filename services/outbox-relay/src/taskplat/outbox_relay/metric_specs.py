"""The metrics of the outbox relay: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

LAMBDA_INVOCATIONS = Metric(
    "taskplat.lambda.invocations",
    "counter",
    "invoke_lambda rows performed, by outcome (invoked, failed, skipped).",
    labels=("outcome",),
    doc=(
        "`invoke_lambda` rows performed: `invoked` (Lambda accepted the claim's invocation), "
        "`failed` (refused, throttled, unreachable or no signing keys: retried with backoff, "
        "`last_error` on the row), `skipped` (the task was no longer claimable)."
    ),
)

EVENTS_ROUTED = Metric(
    "taskplat.events.routed",
    "counter",
    "Events routed (outcome routed) or not (outcome = the reason).",
    labels=("outcome",),
    doc="Events decided: `routed`, `NotCurrentVersion`, `UnknownDataset`.",
)

EVENTS_TASKS_CREATED = Metric(
    "taskplat.events.tasks_created",
    "counter",
    "Downstream tasks created by routing.",
)

EVENTS_ROUTING_LAG = Metric(
    "taskplat.events.routing_lag",
    "histogram",
    "Seconds from an event stored to its downstream tasks created.",
    unit="s",
)

SQS_SENT = Metric(
    "taskplat.sqs.sent",
    "counter",
    "Messages SQS accepted, by task queue and kind.",
    labels=("queue", "kind"),
    doc="Outbox rows SQS accepted; `queue` is the task queue, also for dead letters.",
)

SQS_SEND_ERRORS = Metric(
    "taskplat.sqs.send_errors",
    "counter",
    "Outbox rows whose send failed (retried later), by queue and kind.",
    labels=("queue", "kind"),
    doc=(
        "Outbox rows not sent (refused, missing queue, unsendable), retried later; `queue` is the "
        "task queue, also for dead letters."
    ),
)

OUTBOX_RELAYED = Metric(
    "taskplat.outbox.relayed",
    "counter",
    "Outbox rows marked sent (sent or skipped), by kind.",
    labels=("kind",),
    doc="Outbox rows marked sent.",
)

OUTBOX_SKIPPED = Metric(
    "taskplat.outbox.skipped",
    "counter",
    "Wake-ups marked sent unsent: the task was no longer Queued, by kind.",
    labels=("kind",),
    doc=(
        "Wake-ups marked sent without a message because their task was no longer Queued "
        "(`TASKPLAT_RELAY_SKIP_NOT_QUEUED`); also counted in `taskplat_outbox_relayed_total`."
    ),
)

OUTBOX_HELD = Metric(
    "taskplat.outbox.held",
    "counter",
    (
        "Wake-ups held back (left pending, due again later): their task is deep in a backlog its "
        "queue's workers claim ahead, by kind."
    ),
    labels=("kind",),
    doc=(
        "Wake-ups held back, still pending: their task had `TASKPLAT_RELAY_HOLD_DEPTH` Queued tasks"
        " ahead of it while the queue's workers claimed ahead (a full `task-claim-next` within "
        "`TASKPLAT_RELAY_HOLD_EVIDENCE_SECONDS`, 2 s by default); a row counts each time it is "
        "held. Such a row comes due again within `TASKPLAT_RELAY_HOLD_MAX_SECONDS` and is then "
        "skipped (claimed meanwhile), held again, or sent."
    ),
)

OUTBOX_DEFERRED = Metric(
    "taskplat.outbox.deferred",
    "counter",
    (
        "Wake-ups deferred to the next probe of their queue, held because its SQS queue does not "
        "exist (still pending), by queue."
    ),
    labels=("queue",),
    doc=(
        "Wake-ups of a held queue (its SQS queue does not exist) pushed to its next probe unsent, "
        "still pending; a row counts each time it comes due while the queue is held."
    ),
)

SQS_REQUESTS = Metric(
    "taskplat.sqs.requests",
    "counter",
    "SQS API calls, by operation.",
    labels=("op",),
    doc=(
        "SQS API calls the relay made, by operation (`send_message_batch`, `get_queue_url`, ...); "
        "with the tasks completed, SQS requests per task."
    ),
)

QUEUE_SQS_HOLDS = Metric(
    "taskplat.queue.sqs_holds",
    "counter",
    "Task queues held because their SQS queue does not exist.",
    labels=("queue",),
    doc="Times a queue began to be held: SQS answered that its SQS queue does not exist.",
)

QUEUE_SQS_PROBES = Metric(
    "taskplat.queue.sqs_probes",
    "counter",
    "Probes (GetQueueUrl) of held queues, by whether SQS found the queue.",
    labels=("queue", "found"),
    doc='Probes (GetQueueUrl) of held queues; `found="true"` resumed the queue.',
)

METRICS: tuple[Metric, ...] = (
    LAMBDA_INVOCATIONS,
    EVENTS_ROUTED,
    EVENTS_TASKS_CREATED,
    EVENTS_ROUTING_LAG,
    SQS_SENT,
    SQS_SEND_ERRORS,
    OUTBOX_RELAYED,
    OUTBOX_SKIPPED,
    OUTBOX_HELD,
    OUTBOX_DEFERRED,
    SQS_REQUESTS,
    QUEUE_SQS_HOLDS,
    QUEUE_SQS_PROBES,
)
