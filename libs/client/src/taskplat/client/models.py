"""The client's own models of the dispatcher's answers (no server code is imported).

Invariants: each model names the fields of the server's schema of the same name in
`/openapi.json` (a test compares them, so a contract change shows on both sides in review);
unknown fields a newer server adds are ignored, never an error; timestamps are aware datetimes.
The DAG and dataset answers are kept as plain JSON objects (`JsonObject`) until their schemas are
part of the OpenAPI document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict

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
    operator: str
    queue: str
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


class QueueView(Model):
    name: str
    paused: bool
    paused_at: datetime | None = None
    created_at: datetime
    depth: int
    running: int
    oldest_queued_at: datetime | None = None
    oldest_queued_age_seconds: float | None = None


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


class ErrorResponse(Model):
    error: str
    message: str
    detail: Any = None


# Models checked against the server's schema of the same name.
CHECKED: tuple[type[Model], ...] = (
    JobRef, AttemptView, OutputView, TaskView, TaskList, CreatedTask, CreateTasksResponse,
    QueueView, QueueList, BulkRetrySkipped, BulkRetryResponse, StateCount, ThroughputBucket,
    Stats, ErrorResponse,
)  # fmt: skip
