"""Contracts of the operators' routes: the queue registry (`/queues`), bulk replay
(`POST /tasks/retry`) and the dashboard's figures (`GET /stats`).

Invariants: a bulk replay names either task ids or a filter, never both; a task pinned to a
dataset version that is no longer current is replayed only with `repin`; a filter replays only
`Dead` or `Canceled` tasks and at most `limit` (1-1000) of them per call; ages are seconds, never
negative; throughput buckets are whole minutes of the last hour, oldest first.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BeforeValidator, ConfigDict, Field, model_validator

from taskplat.common.contracts.base import Contract, OperatorName, QueueName, ShortText
from taskplat.common.contracts.public import TaskStatus

MAX_REPLAY = 1000


class QueueSqsState(Contract):
    """Whether the relay sends the queue's wake-ups (`ok`) or holds them because its SQS queue
    does not exist (`missing`): none is sent, its tasks stay Queued and claimable, and the relay
    probes the SQS queue at `next_probe_at` (docs/operations.md)."""

    state: Literal["ok", "missing"]
    since: AwareDatetime | None = Field(description="When the relay found the SQS queue missing.")
    next_probe_at: AwareDatetime | None = Field(
        description="When the relay looks for the SQS queue again (GetQueueUrl)."
    )
    probes: int = Field(ge=0, description="Probes that found it still missing since `since`.")


# Out-of-range limits answer 422: a limit is a positive whole number up to MAX_LIMIT; a rate is
# more than 0 (at least one start in about 17 minutes) and at most MAX_RATE starts a second.
MAX_LIMIT = 1_000_000
MIN_RATE = 0.001
MAX_RATE = 1_000_000.0
MAX_BURST = 100_000


def _json_number(value: object) -> object:
    """Refuse a string or a boolean where a number belongs ("3", true): a limit is a JSON number
    (a whole one, 3 or 3.0, for the counts)."""
    if isinstance(value, str | bool):
        raise ValueError("must be a JSON number")
    return value


Number = BeforeValidator(_json_number)


class RateLimit(Contract):
    """A token bucket of starts shared by every worker: `per_second` on average, `burst` at once."""

    per_second: Annotated[float, Number] = Field(
        ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False, description="Starts a second on average."
    )
    burst: Annotated[int, Number] = Field(
        ge=1, le=MAX_BURST, description="Starts allowed at once (the bucket)."
    )


class QueueLimits(Contract):
    """A queue's limits (`PUT /queues/{queue}` body): each null or absent is no limit; the body
    replaces every limit of the queue (docs/queue-limits.md)."""

    concurrency_limit: Annotated[int, Field(ge=1, le=MAX_LIMIT), Number] | None = Field(
        default=None, description="Tasks of the queue Running at once."
    )
    key_concurrency_limit: Annotated[int, Field(ge=1, le=MAX_LIMIT), Number] | None = Field(
        default=None, description="Tasks Running at once per concurrency key."
    )
    rate_limit: RateLimit | None = Field(default=None, description="Starts a second.")


class QueueLimitsUse(Contract):
    """The use of a queue's limits now; each is null when its limit is not set."""

    running: int | None = Field(
        ge=0, description="Running tasks counted against the concurrency and key limits."
    )
    keys_at_limit: int | None = Field(
        ge=0, description="Concurrency keys with `key_concurrency_limit` tasks Running."
    )
    tokens_left: int | None = Field(ge=0, description="Starts the rate limit allows at once now.")


class QueueView(Contract):
    name: QueueName
    paused: bool
    paused_at: AwareDatetime | None
    created_at: AwareDatetime
    depth: int = Field(description="Tasks Queued on this queue.")
    running: int = Field(description="Tasks Running on this queue.")
    oldest_queued_at: AwareDatetime | None
    oldest_queued_age_seconds: float | None = Field(
        description="Seconds since the oldest Queued task became Queued; null when none is."
    )
    sqs: QueueSqsState = Field(description="The state of the queue's SQS queue for the relay.")
    limits: QueueLimits = Field(description="The queue's limits (`PUT /queues/{queue}`).")
    limits_use: QueueLimitsUse = Field(description="The use of those limits now.")


class QueueList(Contract):
    queues: list[QueueView]


REPIN_DESCRIPTION = (
    "A task pinned to a dataset version that is no longer current is not replayed "
    "(`PinnedVersionNotCurrent`) unless this is true: it is then re-pinned to the current "
    "versions (each input's `dataset_version` becomes its dataset's current one) and replayed."
)

_BULK_FILTERS = ("status", "queue", "operator", "dag", "job", "limit")


class BulkRetryRequest(Contract):
    """`{ids}` or a filter; an empty body replays up to `limit` Dead tasks."""

    # The either-or rule of `_ids_or_filter`, stated in the JSON schema too (OpenAPI clients and
    # the API fuzzer see it): with `ids`, every filter is absent or null.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["ids"], "properties": {"ids": {"type": "array"}}},
            "then": {"properties": {name: {"type": "null"} for name in _BULK_FILTERS}},
        }
    )

    ids: Annotated[list[UUID], Field(min_length=1, max_length=MAX_REPLAY)] | None = None
    status: Literal["Dead", "Canceled"] | None = None
    queue: QueueName | None = None
    operator: OperatorName | None = None
    dag: ShortText | None = None
    job: ShortText | None = None
    limit: Annotated[int, Field(ge=1, le=MAX_REPLAY)] | None = None
    repin: bool = Field(False, description=REPIN_DESCRIPTION)

    @model_validator(mode="after")
    def _ids_or_filter(self) -> BulkRetryRequest:
        filters = [getattr(self, name) for name in _BULK_FILTERS]
        if self.ids is not None and any(value is not None for value in filters):
            raise ValueError(
                "give either `ids` or a filter (status, queue, operator, dag, job, limit)"
            )
        return self


class RetryRequest(Contract):
    """`POST /tasks/{task_id}/retry` (the body is optional)."""

    repin: bool = Field(False, description=REPIN_DESCRIPTION)


class BulkRetrySkipped(Contract):
    task_id: UUID
    reason: Literal["NotFound", "NotReplayable", "PinnedVersionNotCurrent"]


class BulkRetryResponse(Contract):
    replayed: list[UUID] = Field(description="The tasks Queued again, each as a new attempt.")
    skipped: list[BulkRetrySkipped] = Field(
        description="Ids given that were not replayed (unknown, or not Dead or Canceled)."
    )


class StateCount(Contract):
    queue: str
    status: TaskStatus
    tasks: int


class ThroughputBucket(Contract):
    minute: AwareDatetime
    completed: int
    dead: int = Field(description="Tasks that became Dead in this minute.")


class Stats(Contract):
    """`GET /stats`: unfinished tasks by queue and state, finished ones of the last hour, and
    the finishes per minute over the last hour."""

    generated_at: AwareDatetime
    counts: list[StateCount] = Field(
        description="Scheduled, Queued, Running and Failed tasks now; Completed, Dead and "
        "Canceled tasks finished in the last hour."
    )
    throughput: list[ThroughputBucket]
