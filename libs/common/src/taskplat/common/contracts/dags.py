"""Contracts of jobs, DAGs and datasets (`/dags`, `/datasets`), as docs/ARCHITECTURE.md
"Jobs, DAGs and datasets" shapes them.

Invariants: a DAG document is a mapping of job names to jobs; each input reads exactly one of a
job's output (`{job, output_index}`) or a dataset by name (`{dataset}`); output indexes of a job
are distinct; names are identifiers (letters, digits, `_`, `-`). References between jobs, cycles
and cron expressions are checked by the dispatcher's `dag_rules` (they need the whole document).
An event view names its position the way the event was emitted (cursor, or partition and range).
"""

from __future__ import annotations

from typing import Annotated, Literal, Self
from uuid import UUID

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

from taskplat.common.contracts.base import (
    NO_NUL,
    Contract,
    Int64,
    JsonObject,
    OperatorName,
    QueueName,
)
from taskplat.common.contracts.internal import PartitionKey
from taskplat.common.contracts.public import (
    DEFAULT_PRIORITY,
    ConcurrencyKey,
    IdempotencyKey,
    OnExhausted,
    Priority,
)

NAME_PATTERN = r"^[A-Za-z0-9_-]+$"
Name = Annotated[str, Field(min_length=1, max_length=100, pattern=NAME_PATTERN)]
DatasetKind = Literal["external", "postgres", "buffered_postgres", "s3"]
Runtime = Literal["ecs", "lambda"]
Trust = Literal["trusted", "untrusted"]
RouteReason = Literal["Pending", "NotCurrentVersion", "UnknownDataset", "Duplicate"]
WhereClause = Annotated[str, Field(min_length=1, max_length=4096, pattern=NO_NUL)]
Location = Annotated[str, Field(min_length=1, max_length=2048, pattern=NO_NUL)]
CronExpression = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]


class FromJob(Contract):
    job: Name
    output_index: Annotated[int, Field(ge=0, le=100_000)]


class FromDataset(Contract):
    dataset: Name


# Models with a field named after a Python keyword or a BaseModel attribute take it by alias
# (`from`, `schema`) and, for round trips, by name too.
_BY_ALIAS = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class InputSpec(Contract):
    model_config = _BY_ALIAS

    from_: FromJob | FromDataset = Field(alias="from")
    where: WhereClause | None = None


class ColumnSpec(Contract):
    name: Name
    type: Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]


class OutputSpec(Contract):
    model_config = _BY_ALIAS

    index: Annotated[int, Field(ge=0, le=100_000)]
    dataset: Name
    kind: DatasetKind = "postgres"
    location: Location | None = Field(
        None,
        description="Storage location template ({dataset_uuid} and {dataset_version} are filled "
        "in); the kind's default when omitted.",
    )
    schema_: list[ColumnSpec] | None = Field(None, alias="schema", max_length=200)


class JobSpec(Contract):
    operator: OperatorName
    runtime: Runtime = "ecs"
    queue: QueueName = "default"
    config: JsonObject = Field(default_factory=dict)
    schedule: CronExpression | None = Field(
        None, description="Cron expression (five fields, UTC): the scheduler starts a run per tick."
    )
    trust: Trust = "trusted"
    on_exhausted: OnExhausted | None = Field(
        None,
        description="When a task of the job dies: `dead_letter` sends a dead-letter record, "
        "`discard` does not. Default: the operator's, else `dead_letter`.",
    )
    inputs: Annotated[list[InputSpec], Field(max_length=100)] = Field(default_factory=list)
    outputs: Annotated[list[OutputSpec], Field(max_length=100)] = Field(default_factory=list)
    priority: Priority = DEFAULT_PRIORITY
    concurrency_key: ConcurrencyKey | None = Field(
        None, description="The concurrency key of the job's tasks (docs/flow-control.md)."
    )
    max_attempts: Annotated[int, Field(ge=1, le=100)] | None = None
    timeout_seconds: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] | None = None
    backoff_base_seconds: Annotated[float, Field(ge=0, le=86_400)] | None = None
    backoff_max_seconds: Annotated[float, Field(ge=0, le=7 * 86_400)] | None = None

    @model_validator(mode="after")
    def _distinct_output_indexes(self) -> Self:
        indexes = [output.index for output in self.outputs]
        if len(set(indexes)) != len(indexes):
            raise ValueError("outputs must have distinct index values")
        return self


class DagDocument(Contract):
    """The body of `PUT /dags/{dag_name}` (JSON, or YAML with `Content-Type: application/yaml`)."""

    # pydantic documents the key pattern as `patternProperties` alone, which would let other keys
    # through with any value; such keys are refused, and the schema says so.
    jobs: Annotated[
        dict[Name, JobSpec],
        Field(
            min_length=1,
            max_length=500,
            json_schema_extra={
                "propertyNames": {"minLength": 1, "maxLength": 100, "pattern": NAME_PATTERN},
                "additionalProperties": False,
            },
        ),
    ]


class ResolvedInput(Contract):
    model_config = _BY_ALIAS

    from_: FromJob | FromDataset = Field(alias="from")
    where: str | None
    dataset: str
    dataset_uuid: UUID


class ResolvedOutput(Contract):
    index: int
    dataset: str
    dataset_uuid: UUID
    kind: DatasetKind


class JobView(Contract):
    name: str
    operator: str
    runtime: Runtime
    queue: str
    config: JsonObject
    schedule: str | None
    schedule_next_at: AwareDatetime | None
    trust: Trust
    on_exhausted: OnExhausted
    max_attempts: int
    timeout_seconds: int | None
    backoff_base_seconds: float
    backoff_max_seconds: float
    inputs: list[ResolvedInput]
    outputs: list[ResolvedOutput]


class DagView(Contract):
    dag_name: str
    document_hash: str = Field(description="sha256 of the applied document's canonical JSON.")
    created_at: AwareDatetime
    updated_at: AwareDatetime
    changed: bool | None = Field(
        None, description="In the answer of PUT: false when the same document was applied again."
    )
    jobs: list[JobView]


class DagSummary(Contract):
    dag_name: str
    jobs: int
    document_hash: str
    created_at: AwareDatetime
    updated_at: AwareDatetime


class DagList(Contract):
    dags: list[DagSummary]


class DeletedDag(Contract):
    dag_name: str
    deleted: Literal[True] = True


class JobRunRequest(Contract):
    """`POST /dags/{dag_name}/jobs/{job}/runs`: start one run of a job by hand."""

    config: JsonObject = Field(
        default_factory=dict, description="Merged over the job's config for this run."
    )
    inputs: Annotated[list[EventInput], Field(max_length=1000)] = Field(default_factory=list)
    idempotency_key: IdempotencyKey | None = None


class EventInput(Contract):
    """An event a run reads: a dataset version and a position in it. The run is pinned to that
    version; an input naming no version is pinned to the dataset's current one."""

    dataset_uuid: UUID
    dataset_version: UUID | None = Field(
        None, description="Default: the dataset's current version when the run starts."
    )
    cursor: Int64 | None = None
    partition_key: PartitionKey | None = None
    start: Int64 | None = None
    end: Int64 | None = None
    where: WhereClause | None = None


class DatasetVersionView(Contract):
    dataset_version: UUID
    created_at: AwareDatetime
    superseded_at: AwareDatetime | None = Field(
        description="When this version last stopped being current; null while it is current."
    )
    current_since: AwareDatetime = Field(description="When this version last became current.")
    became_current: Literal["created", "rollback"] = Field(
        description="How it last became current: `created` as a new version, `rollback` when it "
        "was made current again by `POST /datasets/{dataset_uuid}/current`."
    )
    current: bool


class DatasetSummary(Contract):
    dataset_uuid: UUID
    name: str
    kind: DatasetKind
    location: str
    current_version: UUID
    created_at: AwareDatetime


class DatasetList(Contract):
    datasets: list[DatasetSummary]


class ColumnView(Contract):
    name: str
    type: str


class DatasetView(Contract):
    model_config = _BY_ALIAS

    dataset_uuid: UUID
    name: str
    kind: DatasetKind
    location: str
    current_version: UUID
    latest_cursor: int | None = Field(
        description="Highest cursor of the current version's events (null before any)."
    )
    versions: list[DatasetVersionView] = Field(description="Newest first.")
    created_at: AwareDatetime
    schema_: list[ColumnView] | None = Field(
        None,
        alias="schema",
        description="buffered_postgres: the current version's columns (org_id and dedupe_key "
        "first); null for other kinds.",
    )
    schema_hash: str | None = Field(
        None, description="buffered_postgres: `sha256:` + hex of the schema producers must send."
    )
    buffer_queue_url: str | None = Field(
        None,
        description="buffered_postgres: the SQS buffer producers publish to; null until the sink "
        "has created it.",
    )
    row_count: int | None = Field(
        None, description="buffered_postgres: rows in the current version's table."
    )


class NewVersionRequest(Contract):
    """`POST /datasets/{dataset_uuid}/versions` (an empty object)."""


class NewVersionResponse(Contract):
    dataset: DatasetView
    canceled_tasks: int = Field(
        description="Live tasks pinned to the version that stopped being current, canceled "
        "(`VersionSuperseded`)."
    )


class CurrentVersionRequest(Contract):
    """`POST /datasets/{dataset_uuid}/current`: make an earlier version current again (a
    rollback)."""

    dataset_version: UUID = Field(description="A version of this dataset (never deleted).")


class Producer(Contract):
    task_id: UUID
    attempt: int


class EventView(Contract):
    event_id: int
    dataset_uuid: UUID
    dataset_version: UUID
    cursor: int | None
    partition_key: str | None
    start: int | None
    end: int | None
    producer: Producer
    routed: bool
    reason: RouteReason | None = Field(
        description="Why the event created nothing: not routed yet (Pending), a version that "
        "was not current when it was routed (NotCurrentVersion), a dataset the platform does not "
        "know (UnknownDataset), or a position of its dataset version already routed for another "
        "event, from any producer (Duplicate)."
    )
    tasks: list[UUID] = Field(description="The tasks this event created.")
    created_at: AwareDatetime
    routed_at: AwareDatetime | None


class EventList(Contract):
    events: list[EventView]
    next_cursor: str | None = Field(
        description="Pass as `cursor` to get the next page (older events); null on the last page."
    )


JobRunRequest.model_rebuild()
