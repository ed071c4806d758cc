"""Contracts of access and the fleet: API keys (`/keys`), the audit log (`/audit`) and the workers
(`/workers`, and the report a wrapper adds to its own calls).

Invariants: a key's secret appears in exactly one body, `KeyCreated`, answered once by
`POST /keys`; every other view of a key has its name and scopes only. Scopes are the four of
`SCOPES`; `admin` includes the three others. A worker report is optional on the calls that carry
it, so an older wrapper that sends none is still served.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, Field

from taskplat.common.contracts.base import Contract, JsonObject, QueueName, ShortText, WorkerId

Scope = Literal["read", "submit", "operate", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "submit", "operate", "admin")
KeyName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
MAX_RUNNING_REPORTED = 1000


class KeyCreateRequest(Contract):
    """`POST /keys`: a new key of these scopes; its secret is answered once."""

    name: KeyName
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=4)]


class KeyView(Contract):
    name: str
    scopes: list[Scope]
    created_at: AwareDatetime
    created_by: str = Field(description="The name of the key that created this one.")


class KeyCreated(Contract):
    name: str
    scopes: list[Scope]
    created_at: AwareDatetime
    key: str = Field(description="The secret, shown only in this answer: store it now.")


class KeyList(Contract):
    keys: list[KeyView]


class RevokedKey(Contract):
    name: str
    revoked: Literal[True] = True


class AuditEntry(Contract):
    audit_id: int
    at: AwareDatetime
    key_name: str = Field(description="Who: the name of the key that made the call.")
    action: str = Field(description="What: the route's name (cancel_task, pause_queue, ...).")
    target: str | None = Field(description="On what: a task id, queue, DAG, dataset or key.")
    outcome: str = Field(description="What it did (canceled, unchanged, replayed 3, ...).")
    detail: JsonObject | None = None


class AuditList(Contract):
    entries: list[AuditEntry]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page.")


class WorkerReport(Contract):
    """What a wrapper says of itself, on a call it makes anyway (at most every few seconds)."""

    worker_id: WorkerId
    queues: Annotated[list[QueueName], Field(max_length=64)]
    slots: Annotated[int, Field(ge=0, le=100_000)]
    version: ShortText
    running: Annotated[list[UUID], Field(max_length=MAX_RUNNING_REPORTED)] = Field(
        default_factory=list, description="The tasks the wrapper runs now."
    )


class WorkerView(Contract):
    worker_id: str
    queues: list[str]
    slots: int
    version: str
    running: list[UUID]
    first_seen: AwareDatetime
    last_seen: AwareDatetime
    seconds_since_seen: float
    state: Literal["alive", "lost"] = Field(
        description="`lost` once the worker has not reported for `worker_lost_seconds`."
    )


class WorkerList(Contract):
    workers: list[WorkerView]
    lost_after_seconds: float
