"""Every call of the client, described once (method, path, query, body, answer model) and sent by
the sync `Client` and the async `AsyncClient` alike.

Invariants: a call is idempotent when repeating it cannot do anything twice (GET, PUT, and a
`POST /tasks` that carries an `idempotency_key`); only idempotent calls are retried after a
transport error, other calls only when the connection was never made. Query parameters that are
None are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote
from uuid import UUID

from taskplat.client import models

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    idempotent: bool = False

    def query(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.params.items() if value is not None}


def _seg(value: str | UUID) -> str:
    return quote(str(value), safe="")


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def create_task(operator: str, **fields: Any) -> Call[models.TaskView]:
    body: dict[str, Any] = {"operator": operator}
    for key, value in fields.items():
        if value is None:
            continue
        body[key] = _time(value) if isinstance(value, datetime) else value
    return Call(
        "POST",
        "/tasks",
        models.TaskView.model_validate,
        body=body,
        idempotent="idempotency_key" in body,
    )


def create_tasks(tasks: list[dict[str, Any]]) -> Call[models.CreateTasksResponse]:
    keyed = all(task.get("idempotency_key") for task in tasks)
    return Call(
        "POST",
        "/tasks/batch",
        models.CreateTasksResponse.model_validate,
        body={"tasks": tasks},
        idempotent=keyed,
    )


def get_task(task_id: str | UUID) -> Call[models.TaskView]:
    return Call("GET", f"/tasks/{_seg(task_id)}", models.TaskView.model_validate, idempotent=True)


def list_tasks(
    *,
    status: str | None = None,
    queue: str | None = None,
    operator: str | None = None,
    dag: str | None = None,
    job: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    idempotency_key: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> Call[models.TaskList]:
    params = {
        "status": status,
        "queue": queue,
        "operator": operator,
        "dag": dag,
        "job": job,
        "since": _time(since),
        "until": _time(until),
        "idempotency_key": idempotency_key,
        "cursor": cursor,
        "limit": limit,
    }
    return Call("GET", "/tasks", models.TaskList.model_validate, params=params, idempotent=True)


def cancel_task(task_id: str | UUID) -> Call[models.TaskView]:
    return Call(
        "PUT", f"/tasks/{_seg(task_id)}/cancel", models.TaskView.model_validate, idempotent=True
    )


def retry_task(task_id: str | UUID, *, repin: bool = False) -> Call[models.TaskView]:
    body = {"repin": True} if repin else None
    return Call("POST", f"/tasks/{_seg(task_id)}/retry", models.TaskView.model_validate, body=body)


def retry_tasks(
    ids: list[str | UUID] | None = None, **filters: Any
) -> Call[models.BulkRetryResponse]:
    body: dict[str, Any] = {key: value for key, value in filters.items() if value is not None}
    if ids is not None:
        body["ids"] = [str(task_id) for task_id in ids]
    return Call("POST", "/tasks/retry", models.BulkRetryResponse.model_validate, body=body)


def list_queues() -> Call[models.QueueList]:
    return Call("GET", "/queues", models.QueueList.model_validate, idempotent=True)


def get_queue(queue: str) -> Call[models.QueueView]:
    return Call("GET", f"/queues/{_seg(queue)}", models.QueueView.model_validate, idempotent=True)


def pause_queue(queue: str) -> Call[models.QueueView]:
    return Call(
        "PUT", f"/queues/{_seg(queue)}/pause", models.QueueView.model_validate, idempotent=True
    )


def resume_queue(queue: str) -> Call[models.QueueView]:
    return Call(
        "PUT", f"/queues/{_seg(queue)}/resume", models.QueueView.model_validate, idempotent=True
    )


def stats() -> Call[models.Stats]:
    return Call("GET", "/stats", models.Stats.model_validate, idempotent=True)


def apply_dag(name: str, document: dict[str, Any]) -> Call[models.DagView]:
    return Call(
        "PUT", f"/dags/{_seg(name)}", models.DagView.model_validate, body=document, idempotent=True
    )


def list_dags() -> Call[models.DagList]:
    return Call("GET", "/dags", models.DagList.model_validate, idempotent=True)


def get_dag(name: str) -> Call[models.DagView]:
    return Call("GET", f"/dags/{_seg(name)}", models.DagView.model_validate, idempotent=True)


def list_datasets() -> Call[models.DatasetList]:
    return Call("GET", "/datasets", models.DatasetList.model_validate, idempotent=True)


def get_dataset(dataset_uuid: str | UUID) -> Call[models.DatasetView]:
    return Call(
        "GET", f"/datasets/{_seg(dataset_uuid)}", models.DatasetView.model_validate, idempotent=True
    )


def rollback_dataset(
    dataset_uuid: str | UUID, dataset_version: str | UUID
) -> Call[models.NewVersionResponse]:
    return Call(
        "POST",
        f"/datasets/{_seg(dataset_uuid)}/current",
        models.NewVersionResponse.model_validate,
        body={"dataset_version": str(dataset_version)},
        idempotent=True,
    )


def dataset_events(
    dataset_uuid: str | UUID, *, dataset_version: str | None = None, cursor: str | None = None
) -> Call[models.EventList]:
    params = {"dataset_version": dataset_version, "cursor": cursor}
    return Call(
        "GET",
        f"/datasets/{_seg(dataset_uuid)}/events",
        models.EventList.model_validate,
        params=params,
        idempotent=True,
    )


def task_events(task_id: str | UUID, *, cursor: str | None = None) -> Call[models.EventList]:
    return Call(
        "GET",
        f"/tasks/{_seg(task_id)}/events",
        models.EventList.model_validate,
        params={"cursor": cursor},
        idempotent=True,
    )


def run_job(
    dag_name: str,
    job: str,
    *,
    config: dict[str, Any] | None = None,
    inputs: list[dict[str, Any]] | None = None,
    idempotency_key: str | None = None,
) -> Call[models.TaskView]:
    body: dict[str, Any] = {"config": config or {}, "inputs": inputs or []}
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    return Call(
        "POST",
        f"/dags/{_seg(dag_name)}/jobs/{_seg(job)}/runs",
        models.TaskView.model_validate,
        body=body,
        idempotent=idempotency_key is not None,
    )


def register_queue(queue: str) -> Call[models.QueueView]:
    return Call("PUT", f"/queues/{_seg(queue)}", models.QueueView.model_validate, idempotent=True)


def set_queue_limits(
    queue: str,
    *,
    concurrency_limit: int | None = None,
    key_concurrency_limit: int | None = None,
    rate_per_second: float | None = None,
    rate_burst: int | None = None,
) -> Call[models.QueueView]:
    """Replace the queue's limits (each None is no limit; rate and burst go together)."""
    body: dict[str, Any] = {
        "concurrency_limit": concurrency_limit,
        "key_concurrency_limit": key_concurrency_limit,
        "rate_limit": None,
    }
    if rate_per_second is not None or rate_burst is not None:
        body["rate_limit"] = {"per_second": rate_per_second, "burst": rate_burst}
    return Call(
        "PUT", f"/queues/{_seg(queue)}", models.QueueView.model_validate, body=body, idempotent=True
    )


def delete_dag(name: str) -> Call[models.DeletedDag]:
    return Call("DELETE", f"/dags/{_seg(name)}", models.DeletedDag.model_validate)


def new_dataset_version(dataset_uuid: str | UUID) -> Call[models.NewVersionResponse]:
    return Call(
        "POST",
        f"/datasets/{_seg(dataset_uuid)}/versions",
        models.NewVersionResponse.model_validate,
        body={},
    )


def create_key(name: str, scopes: list[str]) -> Call[models.KeyCreated]:
    body = {"name": name, "scopes": scopes}
    return Call("POST", "/keys", models.KeyCreated.model_validate, body=body)


def list_keys() -> Call[models.KeyList]:
    return Call("GET", "/keys", models.KeyList.model_validate, idempotent=True)


def revoke_key(name: str) -> Call[models.RevokedKey]:
    return Call("DELETE", f"/keys/{_seg(name)}", models.RevokedKey.model_validate)


def audit_log(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    key: str | None = None,
    action: str | None = None,
    target: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> Call[models.AuditList]:
    params = {
        "since": _time(since),
        "until": _time(until),
        "key": key,
        "action": action,
        "target": target,
        "cursor": cursor,
        "limit": limit,
    }
    return Call("GET", "/audit", models.AuditList.model_validate, params=params, idempotent=True)


def list_workers() -> Call[models.WorkerList]:
    return Call("GET", "/workers", models.WorkerList.model_validate, idempotent=True)
