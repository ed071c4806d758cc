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

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

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


LIMIT_MAX = 1_000_000
Limit = Annotated[int, Field(ge=1, le=LIMIT_MAX)]


class RateLimit(Contract):
    per_second: Annotated[float, Field(ge=0.001, le=LIMIT_MAX)] = Field(
        description="Starts per second on average, across all workers (0.001: one start "
        "every 1,000 s, at the slowest)."
    )
    burst: Limit = Field(description="Starts at once (the token bucket's size).")


class QueueLimits(Contract):
    """The body of `PUT /queues/{queue}`: it replaces the queue's limits (null: no limit)."""

    concurrency_limit: Limit | None = Field(
        None, description="At most this many tasks of the queue Running at once, fleet-wide."
    )
    key_concurrency_limit: Limit | None = Field(
        None, description="At most this many tasks of one concurrency key Running at once."
    )
    rate_limit: RateLimit | None = Field(
        None, description="Starts at most `per_second` on average and `burst` at once."
    )


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
    concurrency_limit: int | None = Field(None, description="See `QueueLimits`.")
    key_concurrency_limit: int | None = Field(None, description="See `QueueLimits`.")
    rate_limit: RateLimit | None = Field(None, description="See `QueueLimits`.")
    keys_at_limit: int = Field(
        0, description="Concurrency keys with `key_concurrency_limit` tasks Running now."
    )
    tokens_left: int | None = Field(
        None, description="Starts the rate limit allows at once now (null: no rate limit)."
    )


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
