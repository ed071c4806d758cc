"""Contracts of the internal worker API (`/internal/*`), shaped as in docs/contracts.md.

Invariants: a worker call names `(task_id, attempt)` and, for heartbeat and completion, the
`lease_token`; `/internal/events` takes the token optionally (the wrapper always sends it). An event
names its position in a dataset version by `cursor` or by a partition (`partition_key`, `start`,
`end`), never both and never neither; a partition key given with its range is `"{start}-{end}"`.
A job task's payload carries its job's outputs resolved at claim time (dataset, current version,
location), so an operator emits events by `output_index` without looking anything up.
Outputs are unique per `output_index` within one completion.

The batch routes (`task-claim-batch`, `task-complete-batch`, `task-claim-next`) carry at most
`MAX_BATCH` items; every item named gets an answer with exactly the meaning of the single-task
route's (a completion's result carries the HTTP status and body `task-complete` would answer).

`task-complete-batch` may carry a `claim_next` (a `task-claim-next` body that does not wait): the
completions and that claim then run in one transaction, and the answer's `claimed` holds what it
claimed. Without `claim_next` the answer has no `claimed` field at all, so a wrapper that predates
it is served; a dispatcher that predates it refuses the field (422).
"""

from __future__ import annotations

from typing import Annotated, Literal, Self
from uuid import UUID

from pydantic import AwareDatetime, Field, model_validator

from taskplat.common.contracts.access import WorkerReport
from taskplat.common.contracts.base import (
    INT64_MAX,
    NO_NUL,
    Contract,
    Int64,
    JsonArray,
    JsonObject,
    JsonValue,
    QueueName,
    WorkerId,
)
from taskplat.common.contracts.public import ErrorResponse, JobRef, TaskStatus

CompletionStatus = Literal["Completed", "Failed", "Canceled"]
FailureReason = Literal["Drained"]
NotClaimedReason = Literal[
    "AlreadyRunning", "Completed", "Canceled", "NotFound", "NotQueued", "Paused",
    "MissingCapabilityKeys", "ConcurrencyLimited", "KeyConcurrencyLimited", "RateLimited",
]  # fmt: skip
# The reasons of a claim a queue limit held back: the task is still Queued and its wake-up must
# come back (docs/flow-control.md).
LIMITED_REASONS: frozenset[str] = frozenset(
    {"ConcurrencyLimited", "KeyConcurrencyLimited", "RateLimited"}
)
NOT_CLAIMED_DETAIL = Field(
    None,
    exclude_if=lambda value: value is None,  # absent unless there is something to say
    description="Only for reason `MissingCapabilityKeys`: what is missing, naming the setting "
    "(the task runs untrusted and the dispatcher cannot sign its capability token; it stays "
    "Queued).",
)
RETRY_AFTER_MS = Field(
    None,
    ge=0,
    exclude_if=lambda value: value is None,  # absent unless a queue limit refused the claim
    description="Only for reasons `ConcurrencyLimited`, `KeyConcurrencyLimited` and `RateLimited`: "
    "how long until the claim may succeed, in milliseconds (a slot frees sooner when a task of "
    "the queue or key ends). The task stays Queued with its place and spent no attempt; a wrapper "
    "keeps its SQS message hidden this long (docs/flow-control.md).",
)
Trust = Literal["trusted", "untrusted"]
RejectReason = Literal[
    "StaleAttempt", "StaleLease", "NotRunning", "Canceled", "NotFound", "NotCanceled"
]

MAX_BATCH = 10  # items of one batch call (the SQS batch size)

Attempt = Annotated[int, Field(ge=1, le=1_000_000)]
ErrorMessage = Annotated[str, Field(max_length=16_384, pattern=NO_NUL)]
PartitionKey = Annotated[str, Field(min_length=1, max_length=256, pattern=NO_NUL)]


class ClaimRequest(Contract):
    task_id: UUID
    worker_id: WorkerId


class OutputTarget(Contract):
    """One output of a job task, resolved when the task was claimed or fetched."""

    output_index: int
    dataset_uuid: UUID
    dataset_version: UUID
    location: str
    dataset: str | None = Field(None, description="The dataset's name.")
    kind: str | None = Field(None, description="The dataset's kind.")
    schema_hash: str | None = Field(
        None, description="buffered_postgres: the schema hash the records must be published with."
    )
    buffer_queue_url: str | None = Field(
        None,
        description="buffered_postgres: the SQS buffer records are published to (null until the "
        "sink has created it).",
    )


class ClaimTask(Contract):
    """The task payload a worker needs to run the operator (also the `task-fetch` body)."""

    task_id: UUID
    attempt: int
    job: JobRef | None
    operator: str
    queue: str
    config: JsonObject
    inputs: JsonArray
    timeout_seconds: int | None
    deadline_at: AwareDatetime | None = Field(
        description="Hard deadline of this attempt; the wrapper kills the operator at this instant."
    )
    outputs: list[OutputTarget] = Field(
        default_factory=list,
        description="The job's outputs at their datasets' current versions (empty for a task of "
        "no job).",
    )
    trust: Trust = Field(
        "trusted",
        description="`untrusted`: the operator runs as a separate unprivileged user and gets the "
        "claim's capability token (its job's `trust`).",
    )
    steps: JsonObject = Field(
        default_factory=dict,
        description="The step results earlier attempts of the task recorded ({step: result}).",
    )


class ClaimedResponse(Contract):
    status: Literal["Claimed"] = "Claimed"
    attempt: int
    lease_token: UUID
    lease_expires_at: AwareDatetime
    task: ClaimTask
    attempt_token: str = Field(
        description="Signed token scoped to this (task_id, attempt): accepted instead of the "
        "worker token on this attempt's heartbeat, events, steps and completion only; it expires "
        "one lease after the attempt's deadline."
    )
    capability_token: str | None = Field(
        None,
        description="For untrusted tasks: signed statement of the input dataset versions the "
        "attempt may read, its output prefixes and its scratch prefix (for the credential broker).",
    )
    trace_context: dict[str, str] | None = Field(
        None,
        description="The W3C trace context (`traceparent`, `tracestate`) of the create that wrote "
        "the task, when it had one: an attempt claimed without its wake-up (which carries it "
        "otherwise) continues that trace.",
    )


class NotClaimedResponse(Contract):
    status: Literal["NotClaimed"] = "NotClaimed"
    reason: NotClaimedReason
    detail: str | None = NOT_CLAIMED_DETAIL
    retry_after_ms: int | None = RETRY_AFTER_MS


class FetchResponse(Contract):
    status: TaskStatus
    task: ClaimTask


class HeartbeatRequest(Contract):
    task_id: UUID
    attempt: Attempt
    lease_token: UUID
    worker: WorkerReport | None = Field(
        None,
        description="Optional: the calling wrapper's report of itself (at most every few "
        "seconds); the dispatcher lists it under `GET /workers`.",
    )


class HeartbeatResponse(Contract):
    status: Literal["Ok"] = "Ok"
    lease_expires_at: AwareDatetime


class Event(Contract):
    """One upstream event: a dataset version reached a cursor or materialised a partition."""

    dataset_uuid: UUID
    dataset_version: UUID
    cursor: Int64 | None = None
    partition_key: PartitionKey | None = None
    start: Int64 | None = None
    end: Int64 | None = None

    @model_validator(mode="after")
    def _one_position(self) -> Self:
        partitioned = (
            self.partition_key is not None or self.start is not None or self.end is not None
        )
        if partitioned and self.cursor is not None:
            raise ValueError("an event has either a cursor or a partition, not both")
        if (self.start is None) != (self.end is None):
            raise ValueError("start and end go together")
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError("start must not exceed end")
        if not partitioned and self.cursor is None:
            raise ValueError(
                "an event needs a position: a cursor, or a partition_key and/or start/end"
            )
        if (
            self.partition_key is not None
            and self.start is not None
            and self.partition_key != f"{self.start}-{self.end}"
        ):
            raise ValueError(
                f"partition_key must be '{{start}}-{{end}}' ('{self.start}-{self.end}') when the "
                "range is given"
            )
        return self


class EventsRequest(Contract):
    task_id: UUID
    attempt: Attempt
    lease_token: UUID | None = None
    events: Annotated[list[Event], Field(min_length=1, max_length=1000)]


class EventsAcceptedResponse(Contract):
    status: Literal["Accepted"] = "Accepted"
    accepted: int = Field(description="Events newly stored (repeats are acknowledged, not stored).")


StepName = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]


class StepRequest(Contract):
    """`POST /internal/steps`: look up (no `result`) or record (`result` given, any JSON value) the
    result of a named step of the current attempt's task. The first recorded result wins."""

    task_id: UUID
    attempt: Attempt
    lease_token: UUID | None = None
    step: StepName
    result: JsonValue = Field(
        None, description="The step's result to record; omit the field to only look it up."
    )

    @property
    def records(self) -> bool:
        return "result" in self.model_fields_set


class StepResponse(Contract):
    status: Literal["Recorded", "Existing", "NotFound"] = Field(
        description="Recorded: this call stored the result; Existing: a result was stored before "
        "(by this or an earlier attempt) and is returned; NotFound: a lookup found none."
    )
    result: JsonValue = Field(None, description="The step's stored result (null when NotFound).")
    attempt: int | None = Field(None, description="The attempt that recorded the result.")


class Output(Contract):
    output_index: Annotated[int, Field(ge=0, le=100_000)]
    dataset_uuid: UUID
    dataset_version: UUID
    location: Annotated[str, Field(max_length=2048, pattern=NO_NUL)] | None = None
    cursor: Int64 | None = None
    row_count: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None


class CompleteRequest(Contract):
    task_id: UUID
    attempt: Attempt
    lease_token: UUID
    status: CompletionStatus
    outputs: Annotated[list[Output], Field(max_length=1000)] = Field(default_factory=list)
    events: Annotated[list[Event], Field(max_length=1000)] = Field(default_factory=list)
    error_message: ErrorMessage | None = None
    result: JsonObject | None = None
    retry_after_seconds: Annotated[float, Field(ge=0, le=7 * 86_400)] | None = Field(
        None,
        description=(
            "With status Failed: retry no earlier than this many seconds from now instead of the "
            "backoff (0 = at once; the wrapper sends 0 for tasks it stopped while draining)."
        ),
    )
    reason: FailureReason | None = Field(
        None,
        description="With status Failed: `Drained` when the worker stopped the attempt while "
        "shutting down. Such an attempt is not the task's fault: it does not count against "
        "`max_attempts` (only against `max_processing_attempts`).",
    )
    retryable: bool = Field(
        True,
        description="With status Failed: false fails the task for good: it becomes Dead at once "
        "(`PermanentFailure`), whatever attempts it has left.",
    )

    @property
    def ended(self) -> str:
        """How the attempt ended: the status, or `Drained` for a drained failure."""
        return "Drained" if self.reason == "Drained" else self.status

    @model_validator(mode="after")
    def _failure_fields(self) -> Self:
        if self.status != "Failed" and (self.reason is not None or not self.retryable):
            raise ValueError("reason and retryable apply to status Failed only")
        if self.reason == "Drained" and not self.retryable:
            raise ValueError("a drained attempt is retried: it cannot be retryable false")
        return self

    @model_validator(mode="after")
    def _unique_outputs(self) -> Self:
        indexes = [output.output_index for output in self.outputs]
        if len(set(indexes)) != len(indexes):
            raise ValueError("outputs must have distinct output_index values")
        return self


class CompleteResponse(Contract):
    status: Literal["Accepted"] = "Accepted"
    task_status: TaskStatus
    repeated: bool = Field(description="True when this completion had already been accepted.")


class RejectedResponse(Contract):
    status: Literal["Rejected"] = "Rejected"
    reason: RejectReason
    message: str | None = None


class ClaimBatchRequest(Contract):
    """`POST /internal/task-claim-batch`: the claims of several wake-ups in one call."""

    worker_id: WorkerId
    task_ids: Annotated[list[UUID], Field(min_length=1, max_length=MAX_BATCH)]


class NotClaimedItem(Contract):
    task_id: UUID
    reason: NotClaimedReason
    detail: str | None = NOT_CLAIMED_DETAIL
    retry_after_ms: int | None = RETRY_AFTER_MS


class ClaimBatchResponse(Contract):
    claimed: list[ClaimedResponse] = Field(
        description="The tasks claimed, in the order they were named."
    )
    not_claimed: list[NotClaimedItem] = Field(
        description="Why each other task_id was not claimed, in the order named (a task_id named "
        "twice in one call is claimed at most once: its later occurrences are here, "
        "AlreadyRunning)."
    )


class ClaimNextRequest(Contract):
    """`POST /internal/task-claim-next`: claim up to `max` Queued tasks of `queue`, oldest first."""

    worker_id: WorkerId
    queue: QueueName
    max: Annotated[int, Field(ge=1, le=MAX_BATCH)]
    wait_seconds: float = Field(
        0.0,
        ge=0,
        le=60,
        description="When no task is free, wait up to this long for one (cut to the "
        "dispatcher's `claim_max_wait_seconds`), and answer as soon as one is claimed; 0 "
        "answers at once.",
    )
    worker: WorkerReport | None = Field(
        None,
        description="Optional: the calling wrapper's report of itself (at most every few "
        "seconds); the dispatcher lists it under `GET /workers`.",
    )


class ClaimNextResponse(Contract):
    claimed: list[ClaimedResponse] = Field(
        description="The tasks claimed (none when no Queued task of the queue was free)."
    )
    not_claimed: list[NotClaimedItem] = Field(
        default_factory=list,
        exclude_if=lambda value: not value,  # absent when empty
        description="Only when the dispatcher left Queued tasks of the queue it may not hand "
        "out (untrusted ones while it has no capability keys: reason `MissingCapabilityKeys`): "
        "some of them, at most `max`.",
    )


class CompleteBatchRequest(Contract):
    """`POST /internal/task-complete-batch`: several completions, each its own transition, and
    optionally the claim of the next tasks, all in one transaction."""

    completions: Annotated[list[CompleteRequest], Field(min_length=1, max_length=MAX_BATCH)]
    claim_next: ClaimNextRequest | None = Field(
        None,
        description="Optional: also claim up to `max` Queued tasks of `queue`, as "
        "`task-claim-next` would (`wait_seconds` must be 0: this call never waits), in the "
        "completions' transaction; the answer's `claimed` holds them. Omitted: no claim, and "
        "the answer has no `claimed` field.",
    )

    @model_validator(mode="after")
    def _claim_does_not_wait(self) -> Self:
        if self.claim_next is not None and self.claim_next.wait_seconds != 0:
            raise ValueError("claim_next.wait_seconds must be 0: a completion batch never waits")
        return self


class CompleteBatchResult(Contract):
    task_id: UUID
    status_code: Literal[200, 404, 409, 422] = Field(
        description="The HTTP status `task-complete` would answer for this completion alone."
    )
    body: CompleteResponse | RejectedResponse | ErrorResponse = Field(
        description="The body `task-complete` would answer for this completion alone."
    )


class CompleteBatchResponse(Contract):
    results: list[CompleteBatchResult] = Field(
        description="One result per completion, in the order given."
    )
    claimed: list[ClaimedResponse] | None = Field(
        None,
        description="Only when the request carried `claim_next`: the tasks it claimed (maybe "
        "none), at most its `max`.",
    )
