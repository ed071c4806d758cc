"""The client's own models of the dispatcher's answers (no server code is imported).

Invariants: each model names the fields of the server's schema of the same name in
`/openapi.json` (a test compares them, so a contract change shows on both sides in review);
unknown fields a newer server adds are ignored, never an error; timestamps are aware datetimes.
Fields named after a Python keyword (`from`) are read by alias.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

TaskStatus = Literal["Scheduled", "Queued", "Running", "Completed", "Failed", "Dead", "Canceled"]
TERMINAL = frozenset({"Completed", "Dead", "Canceled"})
JsonObject = dict[str, Any]


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class JobRef(Model):
    dag_name: str
    name: str


class AttemptView(Model):
    attempt: int
    worker_id: str
    started_at: datetime
    finished_at: datetime | None = None
    outcome: str | None = None
    error: str | None = None


class OutputView(Model):
    output_index: int
    attempt: int
    dataset_uuid: UUID
    dataset_version: UUID
    location: str | None = None
    cursor: int | None = None
    row_count: int | None = None
    committed_at: datetime


class TaskView(Model):
    task_id: UUID
    status: TaskStatus
    attempt: int
    max_attempts: int
    # Attempts counted against max_attempts; attempts ended by infrastructure (a lost or drained
    # worker), bounded by max_processing_attempts.
    counted_attempts: int
    processing_attempts: int
    max_processing_attempts: int
    # dead_letter | discard: whether a dead-letter record is sent when the task dies.
    on_exhausted: str
    operator: str
    queue: str
    # 0-9, lower first: claim-next takes a queue's tasks by priority, then oldest first.
    priority: int
    # Within a priority, claim-next serves keys in turn; a queue may limit Running per key.
    concurrency_key: str | None = None
    job: JobRef | None = None
    config: JsonObject
    inputs: list[Any]
    result: JsonObject | None = None
    last_error: str | None = None
    dead_reason: str | None = None
    cancel_reason: str | None = None
    scheduled_for: datetime | None = None
    next_retry_at: datetime | None = None
    expires_at: datetime | None = None
    timeout_seconds: int | None = None
    backoff_base_seconds: float
    backoff_max_seconds: float
    idempotency_key: str | None = None
    worker_id: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outputs: list[OutputView]
    attempts: list[AttemptView]

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


class TaskList(Model):
    tasks: list[TaskView]
    next_cursor: str | None = None


class CreatedTask(Model):
    created: bool
    task: TaskView


class CreateTasksResponse(Model):
    results: list[CreatedTask]


class QueueSqsState(Model):
    state: Literal["ok", "missing"]
    since: datetime | None = None
    next_probe_at: datetime | None = None
    probes: int


class RateLimit(Model):
    per_second: float
    burst: int


class QueueLimits(Model):
    concurrency_limit: int | None = None
    key_concurrency_limit: int | None = None
    rate_limit: RateLimit | None = None


class QueueLimitsUse(Model):
    running: int | None = None
    keys_at_limit: int | None = None
    tokens_left: int | None = None


class QueueView(Model):
    name: str
    paused: bool
    paused_at: datetime | None = None
    created_at: datetime
    depth: int
    running: int
    oldest_queued_at: datetime | None = None
    oldest_queued_age_seconds: float | None = None
    sqs: QueueSqsState
    limits: QueueLimits
    limits_use: QueueLimitsUse


class QueueList(Model):
    queues: list[QueueView]


class BulkRetrySkipped(Model):
    task_id: UUID
    reason: str


class BulkRetryResponse(Model):
    replayed: list[UUID]
    skipped: list[BulkRetrySkipped]


class StateCount(Model):
    queue: str
    status: TaskStatus
    tasks: int


class ThroughputBucket(Model):
    minute: datetime
    completed: int
    dead: int


class Stats(Model):
    generated_at: datetime
    counts: list[StateCount]
    throughput: list[ThroughputBucket]


class ResolvedInput(Model):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    from_: JsonObject = Field(alias="from")
    where: str | None = None
    dataset: str
    dataset_uuid: UUID


class ResolvedOutput(Model):
    index: int
    dataset: str
    dataset_uuid: UUID
    kind: str


class JobView(Model):
    name: str
    operator: str
    runtime: str
    queue: str
    config: JsonObject
    schedule: str | None = None
    schedule_next_at: datetime | None = None
    trust: str
    on_exhausted: str
    max_attempts: int
    timeout_seconds: int | None = None
    backoff_base_seconds: float
    backoff_max_seconds: float
    inputs: list[ResolvedInput]
    outputs: list[ResolvedOutput]


class DagView(Model):
    dag_name: str
    document_hash: str
    created_at: datetime
    updated_at: datetime
    changed: bool | None = None
    jobs: list[JobView]


class DagSummary(Model):
    dag_name: str
    jobs: int
    document_hash: str
    created_at: datetime
    updated_at: datetime


class DagList(Model):
    dags: list[DagSummary]


class DatasetSummary(Model):
    dataset_uuid: UUID
    name: str
    kind: str
    location: str
    current_version: UUID
    created_at: datetime


class DatasetList(Model):
    datasets: list[DatasetSummary]


class DatasetVersionView(Model):
    dataset_version: UUID
    created_at: datetime
    superseded_at: datetime | None = None
    # When it last became current, and how: "created" (a new version) or "rollback".
    current_since: datetime
    became_current: str
    current: bool


class ColumnView(Model):
    name: str
    type: str


class DatasetView(Model):
    dataset_uuid: UUID
    name: str
    kind: str
    location: str
    current_version: UUID
    latest_cursor: int | None = None
    versions: list[DatasetVersionView]
    created_at: datetime
    # buffered_postgres only: the current version's columns, their hash, the buffer queue (null
    # until the sink created it) and the rows written.
    schema_: list[ColumnView] | None = Field(None, alias="schema")
    schema_hash: str | None = None
    buffer_queue_url: str | None = None
    row_count: int | None = None


class NewVersionResponse(Model):
    """A change of a dataset's current version (a new one, or a rollback): the dataset after it
    and how many live tasks pinned to the replaced version were canceled."""

    dataset: DatasetView
    canceled_tasks: int


class Producer(Model):
    task_id: UUID
    attempt: int


class EventView(Model):
    event_id: int
    dataset_uuid: UUID
    dataset_version: UUID
    cursor: int | None = None
    partition_key: str | None = None
    start: int | None = None
    end: int | None = None
    producer: Producer
    routed: bool
    reason: str | None = None
    tasks: list[UUID]
    created_at: datetime
    routed_at: datetime | None = None


class EventList(Model):
    events: list[EventView]
    next_cursor: str | None = None


class ErrorResponse(Model):
    error: str
    message: str
    detail: Any = None


class DeletedDag(Model):
    dag_name: str
    deleted: bool


Scope = Literal["read", "submit", "operate", "admin"]


class KeyView(Model):
    name: str
    scopes: list[Scope]
    created_at: datetime
    created_by: str


class KeyCreated(Model):
    name: str
    scopes: list[Scope]
    created_at: datetime
    key: str


class KeyList(Model):
    keys: list[KeyView]


class RevokedKey(Model):
    name: str
    revoked: bool


class AuditEntry(Model):
    audit_id: int
    at: datetime
    key_name: str
    action: str
    target: str | None = None
    outcome: str
    detail: JsonObject | None = None


class AuditList(Model):
    entries: list[AuditEntry]
    next_cursor: str | None = None


class WorkerView(Model):
    worker_id: str
    queues: list[str]
    slots: int
    version: str
    running: list[UUID]
    first_seen: datetime
    last_seen: datetime
    seconds_since_seen: float
    state: Literal["alive", "lost"]


class WorkerList(Model):
    workers: list[WorkerView]
    lost_after_seconds: float


# Models checked against the server's schema of the same name.
CHECKED: tuple[type[Model], ...] = (
    JobRef, AttemptView, OutputView, TaskView, TaskList, CreatedTask, CreateTasksResponse,
    RateLimit, QueueLimits, QueueLimitsUse, QueueView, QueueList, BulkRetrySkipped,
    BulkRetryResponse, StateCount, ThroughputBucket, Stats, ErrorResponse, ResolvedInput,
    ResolvedOutput, JobView, DagView, DagSummary, DagList,
    DatasetSummary, DatasetList, DatasetVersionView, DatasetView, Producer, EventView, EventList,
    DeletedDag, NewVersionResponse, KeyView, KeyCreated, KeyList, RevokedKey, AuditEntry,
    AuditList, WorkerView, WorkerList,
)  # fmt: skip
