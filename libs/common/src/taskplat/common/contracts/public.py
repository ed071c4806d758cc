"""Contracts of the public task API (`/tasks`).

Invariants: `max_attempts` is 1-100; timestamps carry a time zone; a task view always lists its
attempts oldest first and its outputs by `output_index`. A bulk create (`POST /tasks/batch`) holds
at most 500 tasks and answers one result per task, in the order given.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field, field_validator

from taskplat.common.contracts.base import (
    NO_NUL,
    Contract,
    JsonArray,
    JsonObject,
    OperatorName,
    QueueName,
    ShortText,
    WorkerId,
)

TaskStatus = Literal["Scheduled", "Queued", "Running", "Completed", "Failed", "Dead", "Canceled"]
OnExhausted = Literal["dead_letter", "discard"]
AttemptOutcome = Literal[
    "Completed", "Failed", "LeaseExpired", "DeadlineExceeded", "Canceled", "Drained"
]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]
Priority = Annotated[
    int,
    Field(
        ge=0,
        le=9,
        description="0-9, lower first: claim-next takes the tasks of a queue by priority, "
        "then oldest first.",
    ),
]
DEFAULT_PRIORITY = 5
ConcurrencyKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[\x20-\x7e]+$",
        description="1-200 printable characters (a customer, a store, an account): within a "
        "priority, claim-next serves keys in turn, and a queue's `key_concurrency_limit` bounds "
        "the Running tasks of each key. Tasks without one share one key of their own.",
    ),
]
TERMINAL_STATUSES: frozenset[str] = frozenset({"Completed", "Dead", "Canceled"})


class JobRef(Contract):
    """The job a task belongs to (`{dag_name, name}`, docs/contracts.md)."""

    dag_name: ShortText
    name: ShortText


# SQS names derived from a task queue: `<prefix><queue>` with its poison-message DLQ
# `<prefix><queue>-dlq`, beside the dead-letter record queue `<prefix>dead-letters`.
RESERVED_QUEUE_NAMES = frozenset({"dead-letters"})
RESERVED_QUEUE_SUFFIX = "-dlq"


class CreateTaskRequest(Contract):
    operator: OperatorName
    config: JsonObject = Field(default_factory=dict)
    inputs: JsonArray = Field(default_factory=list, max_length=10_000)
    queue: QueueName = "default"
    max_attempts: Annotated[int, Field(ge=1, le=100)] | None = None
    max_processing_attempts: Annotated[int, Field(ge=1, le=100)] | None = Field(
        None,
        description="How many attempts may end by infrastructure (the worker vanished, or was "
        "drained on a deploy) before the task is Dead (`ProcessingAttemptsExceeded`); such "
        "attempts do not count against `max_attempts`. Default: the operator's, else 10.",
    )
    on_exhausted: OnExhausted | None = Field(
        None,
        description="When the task dies: `dead_letter` sends a dead-letter record, `discard` "
        "does not. Default: the operator's, else `dead_letter`; a task of a job follows its job.",
    )
    timeout_seconds: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] | None = None
    backoff_base_seconds: Annotated[float, Field(ge=0, le=86_400)] | None = None
    backoff_max_seconds: Annotated[float, Field(ge=0, le=7 * 86_400)] | None = None
    scheduled_for: AwareDatetime | None = None
    expires_at: AwareDatetime | None = None
    idempotency_key: IdempotencyKey | None = None
    job: JobRef | None = None
    priority: Priority = DEFAULT_PRIORITY
    concurrency_key: ConcurrencyKey | None = None

    @field_validator("queue")
    @classmethod
    def _not_a_reserved_queue(cls, queue: str) -> str:
        if queue in RESERVED_QUEUE_NAMES or queue.endswith(RESERVED_QUEUE_SUFFIX):
            raise ValueError(
                f"queue names ending in '{RESERVED_QUEUE_SUFFIX}' and 'dead-letters' are reserved "
                "for the dead-letter queues"
            )
        return queue


class OutputView(Contract):
    output_index: int
    attempt: int
    dataset_uuid: UUID
    dataset_version: UUID
    location: str | None
    cursor: int | None
    row_count: int | None
    committed_at: AwareDatetime


class AttemptView(Contract):
    attempt: int
    worker_id: WorkerId
    started_at: AwareDatetime
    finished_at: AwareDatetime | None
    outcome: AttemptOutcome | None
    error: str | None


class TaskView(Contract):
    task_id: UUID
    status: TaskStatus
    attempt: int
    max_attempts: int
    counted_attempts: int = Field(
        description="The current attempt's number in the `max_attempts` budget (`attempt` less "
        "the attempts before a replay and those that ended by infrastructure: LeaseExpired, "
        "Drained, the current one included once it ended so)."
    )
    processing_attempts: int = Field(
        description="Attempts of the current budget that ended by infrastructure (the worker "
        "vanished or was drained), bounded by `max_processing_attempts`."
    )
    max_processing_attempts: int
    on_exhausted: OnExhausted
    operator: str
    queue: str
    priority: int
    concurrency_key: str | None = None
    job: JobRef | None
    config: JsonObject
    inputs: JsonArray
    result: JsonObject | None
    last_error: str | None
    dead_reason: (
        Literal["AttemptsExhausted", "Expired", "ProcessingAttemptsExceeded", "PermanentFailure"]
        | None
    )
    cancel_reason: Literal["Requested", "VersionSuperseded"] | None = Field(
        description="Why a Canceled task was canceled: by a person, or by a new dataset version."
    )
    scheduled_for: AwareDatetime | None
    next_retry_at: AwareDatetime | None
    expires_at: AwareDatetime | None
    timeout_seconds: int | None
    backoff_base_seconds: float
    backoff_max_seconds: float
    idempotency_key: str | None
    worker_id: str | None
    created_at: AwareDatetime
    started_at: AwareDatetime | None
    finished_at: AwareDatetime | None
    outputs: list[OutputView]
    attempts: list[AttemptView]


class TaskList(Contract):
    tasks: list[TaskView]
    next_cursor: str | None = Field(
        description="Pass as `cursor` to get the next page; null on the last page."
    )


class ErrorResponse(Contract):
    error: str = Field(
        description="Stable error code: snake_case, or a reason name the route documents "
        "(`PinnedVersionNotCurrent`)."
    )
    message: str
    detail: Any = None


MAX_TASKS_PER_BATCH = 500


class CreateTasksRequest(Contract):
    """`POST /tasks/batch`: several tasks created in one transaction."""

    tasks: Annotated[list[CreateTaskRequest], Field(min_length=1, max_length=MAX_TASKS_PER_BATCH)]


class CreatedTask(Contract):
    created: bool = Field(
        description="False when a task with this idempotency_key already existed (it is returned)."
    )
    task: TaskView


class CreateTasksResponse(Contract):
    results: list[CreatedTask] = Field(description="One result per task, in the order given.")
