"""The metrics of several services: name, kind, unit, labels and meaning, declared once.

Invariants: every instrument of this package is created from a declaration here (see
taskplat.common.metric_spec); docs/reference/metrics.md is generated from `METRICS`.
"""

from __future__ import annotations

from taskplat.common.metric_spec import Metric

HTTP_SERVER_DURATION = Metric(
    "taskplat.http.server.duration",
    "histogram",
    "HTTP request durations by route.",
    labels=("method", "route", "status"),
    unit="s",
    doc=(
        "Request durations by route template (`unmatched` for a path no route serves) of the "
        "dispatcher, the credential broker and the query service, each on its own `/metrics`."
    ),
)

LOOP_BATCH_DURATION = Metric(
    "taskplat.loop.batch.duration",
    "histogram",
    "Duration of one loop batch.",
    labels=("loop",),
    unit="s",
    doc="Duration of each batch of the relay, scheduler and reaper.",
)

LOOP_BATCH_SIZE = Metric(
    "taskplat.loop.batch.size",
    "histogram",
    "Items a batch handled, by kind (a field of the batch result).",
    labels=("loop", "kind"),
    doc="Items per batch, by kind (e.g. `sent`, `promoted`, `lease_expired`).",
)

LOOP_BATCHES = Metric(
    "taskplat.loop.batches",
    "counter",
    "Loop batches completed, by full (true: the batch hit its limit).",
    labels=("loop", "full"),
    doc=(
        'Completed batches; `full="true"` when the batch hit its limit (more work was waiting): the'
        " share of full batches is the loop's saturation, the scheduler's and reaper's scaling "
        "signal on ECS."
    ),
)

LOOP_ERRORS = Metric(
    "taskplat.loop.errors",
    "counter",
    "Loop batches that raised an error.",
    labels=("loop",),
    doc="Batches that raised an error (the loop backs off and retries).",
)

CLAIMS_REFUSED = Metric(
    "taskplat.claims.refused",
    "counter",
    (
        "Untrusted tasks a claim left Queued because this process has no capability keys "
        "(`setting`: the missing one)."
    ),
    labels=("setting",),
    doc=(
        "Untrusted tasks a claim left Queued because the process (dispatcher, or the relay for a "
        "Lambda job) has no capability keys: `setting` is `TASKPLAT_CAPABILITY_TOKEN_KEYS`. Set the"
        " keys and restart; the dispatcher's `/readyz` shows `untrusted.ready: false` meanwhile. A "
        "claim by id also answers `NotClaimed` `MissingCapabilityKeys` (with a `detail` naming the "
        "setting), a claim-next lists them in `not_claimed`."
    ),
)

METRICS: tuple[Metric, ...] = (
    HTTP_SERVER_DURATION,
    LOOP_BATCH_DURATION,
    LOOP_BATCH_SIZE,
    LOOP_BATCHES,
    LOOP_ERRORS,
    CLAIMS_REFUSED,
)
