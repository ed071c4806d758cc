"""The public routes of jobs, DAGs and datasets (docs/ARCHITECTURE.md "Jobs, DAGs and datasets").

Invariants: every route needs an API key; a DAG document is read size-capped and parsed as YAML
when its content type says so, else as JSON, within the document limits and off the event loop
(`off_loop`), and is checked whole before anything is stored; path
names (DAG and job names) are validated like the document's names, dataset uuids as UUIDs.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from taskplat.common.contracts import (
    CurrentVersionRequest,
    DagDocument,
    DagList,
    DagView,
    DatasetList,
    DatasetView,
    DeletedDag,
    ErrorResponse,
    EventList,
    JobRunRequest,
    NewVersionResponse,
    TaskView,
)
from taskplat.common.contracts.base import Contract
from taskplat.common.errors import ValidationFailed
from taskplat.dispatcher.dag_rules import parse_document
from taskplat.dispatcher.dags import DagService
from taskplat.dispatcher.datasets import DatasetService
from taskplat.dispatcher.errors import json_response
from taskplat.dispatcher.requests import (
    document_limits,
    off_loop,
    parse_body,
    parse_query,
    parse_uuid,
    read_body,
)
from taskplat.dispatcher.route_guard import (
    RouteSpec,
    audit_call,
    bind_log_fields,
    holds,
    settings_of,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


class EventsQuery(Contract):
    dataset_version: str | None = None
    cursor: Annotated[str, Field(max_length=512)] | None = None
    limit: Annotated[int, Field(ge=1, le=500)] = 100


def _dags(request: Request) -> DagService:
    service: DagService = request.app.state.dags
    return service


def _datasets(request: Request) -> DatasetService:
    service: DatasetService = request.app.state.datasets
    return service


def _name(request: Request, param: str) -> str:
    value = str(request.path_params[param])
    if not _NAME.match(value):
        raise ValidationFailed(
            f"{param} must be 1-100 letters, digits, '_' or '-'",
            detail=[{"loc": ["path", param], "msg": "invalid name", "type": "name"}],
        )
    return value


async def put_dag(request: Request) -> Response:
    dag_name = _name(request, "dag_name")
    body = await read_body(request, settings_of(request).max_body_bytes)
    content_type = request.headers.get("content-type", "application/json")
    doc = await off_loop(parse_document, body, content_type, document_limits(request))
    view, created = await _dags(request).apply(dag_name, doc, audit_call(request))
    return json_response(view, 201 if created else 200)


async def list_dags(request: Request) -> Response:
    return json_response(await _dags(request).list())


async def get_dag(request: Request) -> Response:
    return json_response(await _dags(request).get(_name(request, "dag_name")))


async def delete_dag(request: Request) -> Response:
    dag_name = _name(request, "dag_name")
    await _dags(request).delete(dag_name, audit_call(request))
    return json_response(DeletedDag(dag_name=dag_name))


async def start_run(request: Request) -> Response:
    dag_name, job_name = _name(request, "dag_name"), _name(request, "job")
    body = await parse_body(request, JobRunRequest, settings_of(request).max_body_bytes)
    view, created = await _dags(request).start_run(
        dag_name, job_name, body, may_widen=holds(request, "operate")
    )
    bind_log_fields(task_id=view.task_id)
    return json_response(view, 201 if created else 200)


async def list_datasets(request: Request) -> Response:
    return json_response(await _datasets(request).list_datasets())


async def get_dataset(request: Request) -> Response:
    dataset_uuid = parse_uuid(request.path_params["dataset_uuid"], name="dataset_uuid")
    return json_response(await _datasets(request).get_dataset(dataset_uuid))


async def new_version(request: Request) -> Response:
    dataset_uuid = parse_uuid(request.path_params["dataset_uuid"], name="dataset_uuid")
    body = await read_body(request, settings_of(request).max_body_bytes)
    if body.strip() not in (b"", b"{}"):
        raise ValidationFailed(
            "this route takes no fields (send {} or nothing)",
            detail=[{"loc": ["body"], "msg": "unexpected fields", "type": "extra_forbidden"}],
        )
    return json_response(
        await _datasets(request).new_version(dataset_uuid, audit_call(request)), 201
    )


async def make_current(request: Request) -> Response:
    dataset_uuid = parse_uuid(request.path_params["dataset_uuid"], name="dataset_uuid")
    body = await parse_body(request, CurrentVersionRequest, settings_of(request).max_body_bytes)
    view = await _datasets(request).make_current(
        dataset_uuid, body.dataset_version, audit_call(request)
    )
    return json_response(view)


async def list_events(request: Request) -> Response:
    dataset_uuid = parse_uuid(request.path_params["dataset_uuid"], name="dataset_uuid")
    query = parse_query(request, EventsQuery)
    version = (
        parse_uuid(query.dataset_version, name="dataset_version", where="query")
        if query.dataset_version is not None
        else None
    )
    page = await _datasets(request).events(dataset_uuid, version, query.cursor, query.limit)
    return json_response(page)


class TaskEventsQuery(Contract):
    cursor: Annotated[str, Field(max_length=512)] | None = None
    limit: Annotated[int, Field(ge=1, le=500)] = 100


async def list_task_events(request: Request) -> Response:
    task_id = parse_uuid(request.path_params["task_id"], name="task_id")
    bind_log_fields(task_id=task_id)
    query = parse_query(request, TaskEventsQuery)
    return json_response(await _datasets(request).task_events(task_id, query.cursor, query.limit))


_AUTH_FAIL = (401, ("missing or wrong bearer token", ErrorResponse))
_BAD_BODY = (400, ("malformed JSON or YAML", ErrorResponse))
_INVALID = (422, ("the request does not match the contract", ErrorResponse))
_TOO_LARGE = (413, ("request body over the size cap", ErrorResponse))
_NO_DAG = (404, ("no such DAG (or job)", ErrorResponse))
_NO_DATASET = (404, ("no such dataset", ErrorResponse))

DAG_ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("PUT", "/dags/{dag_name}", "put_dag",
              "Apply a DAG document (JSON, or YAML with Content-Type: application/yaml)",
              "api_key", put_dag, body=DagDocument, path_params=("dag_name",),
              body_media_types=("application/json", "application/yaml"),
              responses={201: ("DAG created", DagView),
                         200: ("DAG replaced, or the same document again (changed: false)",
                               DagView),
                         **dict([_AUTH_FAIL, _BAD_BODY, _INVALID, _TOO_LARGE])}),
    RouteSpec("GET", "/dags", "list_dags", "List DAGs", "api_key", list_dags,
              responses={200: ("every DAG", DagList), **dict([_AUTH_FAIL])}),
    RouteSpec("GET", "/dags/{dag_name}", "get_dag",
              "Read a DAG: its jobs with their resolved dataset uuids", "api_key", get_dag,
              path_params=("dag_name",),
              responses={200: ("the DAG", DagView), **dict([_AUTH_FAIL, _INVALID, _NO_DAG])}),
    RouteSpec("DELETE", "/dags/{dag_name}", "delete_dag",
              "Delete a DAG: routing and schedules stop; tasks and datasets stay", "api_key",
              delete_dag, path_params=("dag_name",),
              responses={200: ("deleted", DeletedDag), **dict([_AUTH_FAIL, _INVALID, _NO_DAG])}),
    RouteSpec("POST", "/dags/{dag_name}/jobs/{job}/runs", "start_run",
              "Start one run of a job", "api_key", start_run, body=JobRunRequest,
              path_params=("dag_name", "job"),
              responses={201: ("the run's task", TaskView),
                         200: ("a task with this idempotency_key already exists", TaskView),
                         **dict([_AUTH_FAIL, _BAD_BODY, _INVALID, _TOO_LARGE, _NO_DAG])}),
    RouteSpec("GET", "/datasets", "list_datasets", "List datasets", "api_key", list_datasets,
              responses={200: ("every dataset", DatasetList), **dict([_AUTH_FAIL])}),
    RouteSpec("GET", "/datasets/{dataset_uuid}", "get_dataset",
              "Read a dataset: versions, the current one, the latest cursor", "api_key",
              get_dataset, path_params=("dataset_uuid",),
              responses={200: ("the dataset", DatasetView),
                         **dict([_AUTH_FAIL, _INVALID, _NO_DATASET])}),
    RouteSpec("POST", "/datasets/{dataset_uuid}/versions", "new_dataset_version",
              "Make a new current version; live tasks pinned to older ones are canceled",
              "api_key", new_version, path_params=("dataset_uuid",),
              responses={201: ("the dataset at its new version", NewVersionResponse),
                         **dict([_AUTH_FAIL, _INVALID, _TOO_LARGE, _NO_DATASET])}),
    RouteSpec("POST", "/datasets/{dataset_uuid}/current", "make_dataset_version_current",
              "Roll back: make an earlier version current again; live tasks pinned to the "
              "version that stops being current are canceled (VersionSuperseded)",
              "api_key", make_current, path_params=("dataset_uuid",), body=CurrentVersionRequest,
              responses={200: ("the dataset at its restored version (the current version "
                               "again changes nothing)", NewVersionResponse),
                         **dict([_AUTH_FAIL, _BAD_BODY, _INVALID, _TOO_LARGE, _NO_DATASET])}),
    RouteSpec("GET", "/tasks/{task_id}/events", "list_task_events",
              "The events a task emitted, newest first, with their routing", "api_key",
              list_task_events, path_params=("task_id",), query=TaskEventsQuery,
              responses={200: ("one page of events", EventList),
                         404: ("no such task", ErrorResponse),
                         **dict([_AUTH_FAIL, _INVALID])}),
    RouteSpec("GET", "/datasets/{dataset_uuid}/events", "list_dataset_events",
              "A dataset's events, newest first, with their routing", "api_key", list_events,
              path_params=("dataset_uuid",), query=EventsQuery,
              responses={200: ("one page of events", EventList),
                         **dict([_AUTH_FAIL, _INVALID, _NO_DATASET])}),
)  # fmt: skip
