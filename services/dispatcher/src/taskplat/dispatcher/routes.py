"""The task, queue and worker routes of the dispatcher, declared once in `ROUTES` (the DAG and
dataset routes are `dag_routes`', the access routes `access_routes`'); the handlers and the
OpenAPI document are both built from the declarations (`route_table`), each handler wrapped by
`route_guard.guarded`.

Invariants: a handler validates the whole request before it calls the service, so invalid input
never writes. A handler binds the task it acts on (`task_id`, `attempt`, `worker_id`) to the
request's log context. A worker's report of itself (`worker` on claim-next and heartbeat) is
stored only when the worker token made the call. Health, readiness, metrics and the OpenAPI
document are open (`app`).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from pydantic import AwareDatetime, Field
from starlette.requests import Request
from starlette.responses import Response

from taskplat.common.contracts import (
    BulkRetryRequest,
    BulkRetryResponse,
    ClaimBatchRequest,
    ClaimBatchResponse,
    ClaimedResponse,
    ClaimNextRequest,
    ClaimNextResponse,
    ClaimRequest,
    CompleteBatchRequest,
    CompleteBatchResponse,
    CompleteRequest,
    CompleteResponse,
    CreateTaskRequest,
    CreateTasksRequest,
    CreateTasksResponse,
    ErrorResponse,
    EventsAcceptedResponse,
    EventsRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    NotClaimedResponse,
    QueueList,
    QueueView,
    RejectedResponse,
    RetryRequest,
    Stats,
    StepRequest,
    StepResponse,
    TaskList,
    TaskStatus,
    TaskView,
)
from taskplat.common.contracts.access import WorkerReport
from taskplat.common.contracts.base import Contract, OperatorName, QueueName
from taskplat.dispatcher.access_service import AccessService
from taskplat.dispatcher.errors import json_response
from taskplat.dispatcher.operations import Operations
from taskplat.dispatcher.requests import parse_body, parse_query, parse_queue_name, parse_uuid
from taskplat.dispatcher.route_guard import (
    RouteSpec,
    audit_call,
    bind_log_fields,
    holds,
    read_body,
    service_of,
    settings_of,
)
from taskplat.dispatcher.service_rules import ListFilters


class ListTasksQuery(Contract):
    status: TaskStatus | None = None
    queue: QueueName | None = None
    operator: OperatorName | None = None
    dag: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    job: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    since: AwareDatetime | None = Field(None, description="Created at or after this time.")
    until: AwareDatetime | None = Field(None, description="Created before this time.")
    idempotency_key: Annotated[str, Field(min_length=1, max_length=512)] | None = Field(
        None, description="The task of this idempotency key (the other filters are ignored)."
    )
    cursor: Annotated[str, Field(max_length=512)] | None = None
    limit: Annotated[int, Field(ge=1, le=500)] = 50


class FetchQuery(Contract):
    # Parsed by the handler (a 422 naming task_id); documented as what it must be, a UUID.
    task_id: Annotated[str, Field(json_schema_extra={"format": "uuid"})]


def _operations(request: Request) -> Operations:
    operations: Operations = request.app.state.operations
    return operations


# ---- public ------------------------------------------------------------------------------


async def create_task(request: Request) -> Response:
    body = await read_body(request, CreateTaskRequest)
    view, created = await service_of(request).create(body, may_widen=holds(request, "operate"))
    return json_response(view, 201 if created else 200)


async def create_tasks(request: Request) -> Response:
    body = await read_body(request, CreateTasksRequest)
    created = await service_of(request).create_many(body, may_widen=holds(request, "operate"))
    return json_response(created, 201)


async def list_tasks(request: Request) -> Response:
    query = parse_query(request, ListTasksQuery)
    limit = min(query.limit, settings_of(request).list_max_limit)
    filters = ListFilters(
        query.status,
        query.queue,
        query.operator,
        query.cursor,
        limit,
        query.dag,
        query.job,
        since=query.since,
        until=query.until,
        idempotency_key=query.idempotency_key,
    )
    return json_response(await service_of(request).list(filters))


async def get_task(request: Request) -> Response:
    task_id = parse_uuid(request.path_params["task_id"], name="task_id")
    bind_log_fields(task_id=task_id)
    return json_response(await service_of(request).get(task_id))


async def cancel_task(request: Request) -> Response:
    task_id = parse_uuid(request.path_params["task_id"], name="task_id")
    bind_log_fields(task_id=task_id)
    return json_response(await service_of(request).cancel(task_id, audit_call(request)))


async def retry_task(request: Request) -> Response:
    task_id = parse_uuid(request.path_params["task_id"], name="task_id")
    bind_log_fields(task_id=task_id)
    body = await parse_body(
        request, RetryRequest, settings_of(request).max_body_bytes, optional=True
    )
    return json_response(
        await service_of(request).replay(task_id, audit_call(request), repin=body.repin)
    )


async def retry_tasks(request: Request) -> Response:
    body = await read_body(request, BulkRetryRequest)
    return json_response(await _operations(request).replay_many(body, audit_call(request)))


async def list_queues(request: Request) -> Response:
    return json_response(await _operations(request).queues())


async def get_queue(request: Request) -> Response:
    queue = parse_queue_name(request.path_params["queue"])
    return json_response(await _operations(request).view(queue))


async def pause_queue(request: Request) -> Response:
    queue = parse_queue_name(request.path_params["queue"])
    return json_response(await _operations(request).pause(queue, audit_call(request)))


async def resume_queue(request: Request) -> Response:
    queue = parse_queue_name(request.path_params["queue"])
    return json_response(await _operations(request).resume(queue, audit_call(request)))


async def stats(request: Request) -> Response:
    return json_response(await _operations(request).stats())


# ---- internal ----------------------------------------------------------------------------


async def _report_worker(request: Request, report: WorkerReport | None) -> None:
    """Store a wrapper's report of itself; only the worker token may report (an operator's
    attempt token may not speak for the wrapper)."""
    if report is None or getattr(request.state, "attempt_scope", None) is not None:
        return
    access: AccessService = request.app.state.access
    await access.report(report)


async def task_claim(request: Request) -> Response:
    body = await read_body(request, ClaimRequest)
    bind_log_fields(task_id=body.task_id, worker_id=body.worker_id)
    return json_response(await service_of(request).claim(body))


async def task_claim_batch(request: Request) -> Response:
    body = await read_body(request, ClaimBatchRequest)
    bind_log_fields(worker_id=body.worker_id)
    return json_response(await service_of(request).claim_batch(body))


async def task_claim_next(request: Request) -> Response:
    body = await read_body(request, ClaimNextRequest)
    bind_log_fields(worker_id=body.worker_id)
    await _report_worker(request, body.worker)
    if body.wait_seconds <= 0:
        return json_response(await service_of(request).claim_next(body))
    # The body is read: the next ASGI message is the client's disconnect.
    gone: asyncio.Future[object] = asyncio.ensure_future(request.receive())
    try:
        return json_response(await service_of(request).claim_next(body, gone))
    finally:
        gone.cancel()


async def task_fetch(request: Request) -> Response:
    query = parse_query(request, FetchQuery)
    task_id = parse_uuid(query.task_id, name="task_id", where="query")
    bind_log_fields(task_id=task_id)
    return json_response(await service_of(request).fetch(task_id))


async def heartbeat(request: Request) -> Response:
    body = await read_body(request, HeartbeatRequest)
    bind_log_fields(task_id=body.task_id, attempt=body.attempt)
    await _report_worker(request, body.worker)
    return json_response(await service_of(request).heartbeat(body))


async def events(request: Request) -> Response:
    body = await read_body(request, EventsRequest)
    bind_log_fields(task_id=body.task_id, attempt=body.attempt)
    return json_response(await service_of(request).events(body))


async def steps(request: Request) -> Response:
    body = await read_body(request, StepRequest)
    bind_log_fields(task_id=body.task_id, attempt=body.attempt)
    return json_response(await service_of(request).step(body))


async def task_complete(request: Request) -> Response:
    body = await read_body(request, CompleteRequest)
    bind_log_fields(task_id=body.task_id, attempt=body.attempt)
    return json_response(await service_of(request).complete(body))


async def task_complete_batch(request: Request) -> Response:
    body = await read_body(request, CompleteBatchRequest)
    if body.claim_next is None:  # no `claimed` field: a wrapper that predates it is served
        answer = await service_of(request).complete_batch(body)
        return Response(
            answer.model_dump_json(by_alias=True, exclude={"claimed"}),
            media_type="application/json",
        )
    bind_log_fields(worker_id=body.claim_next.worker_id)
    await _report_worker(request, body.claim_next.worker)
    return json_response(await service_of(request).complete_batch(body))


_AUTH_FAIL = (401, ("missing or wrong bearer token", ErrorResponse))
_BAD_JSON = (400, ("malformed JSON", ErrorResponse))
_INVALID = (422, ("the request does not match the contract", ErrorResponse))
_TOO_LARGE = (413, ("request body over the size cap", ErrorResponse))
_NOT_FOUND = (404, ("no such task", ErrorResponse))
_REJECTED = (409, ("stale attempt or lease, not running, or canceled", RejectedResponse))
_WORKER_NOT_FOUND = (404, ("no such task", RejectedResponse))
_BODY_ERRORS = dict([_AUTH_FAIL, _BAD_JSON, _INVALID, _TOO_LARGE])
_AUTH = dict([_AUTH_FAIL])
_QUEUE_ERRORS = dict([_AUTH_FAIL, _INVALID, (404, ("no such queue", ErrorResponse))])

ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("POST", "/tasks", "create_task", "Create a task", "api_key", create_task,
              body=CreateTaskRequest,
              responses={201: ("task created", TaskView),
                         200: ("a task with this idempotency_key already exists", TaskView),
                         **_BODY_ERRORS}),
    RouteSpec("POST", "/tasks/batch", "create_tasks",
              "Create up to 500 tasks in one transaction", "api_key", create_tasks,
              body=CreateTasksRequest,
              responses={201: ("one result per task, in order (created or the existing task of "
                               "its idempotency_key)", CreateTasksResponse),
                         **_BODY_ERRORS}),
    RouteSpec("GET", "/tasks", "list_tasks", "List tasks, newest first", "api_key", list_tasks,
              query=ListTasksQuery,
              responses={200: ("one page of tasks", TaskList), **dict([_AUTH_FAIL, _INVALID])}),
    RouteSpec("GET", "/tasks/{task_id}", "get_task", "Read a task", "api_key", get_task,
              path_params=("task_id",),
              responses={200: ("the task", TaskView), **dict([_AUTH_FAIL, _INVALID, _NOT_FOUND])}),
    RouteSpec("PUT", "/tasks/{task_id}/cancel", "cancel_task", "Cancel a task", "api_key",
              cancel_task, path_params=("task_id",),
              responses={200: ("the canceled task", TaskView),
                         409: ("the task is Completed or Dead", ErrorResponse),
                         **dict([_AUTH_FAIL, _INVALID, _NOT_FOUND])}),
    RouteSpec("POST", "/tasks/{task_id}/retry", "retry_task",
              "Replay a Dead or Canceled task as a new attempt with a fresh budget", "api_key",
              retry_task, path_params=("task_id",), body=RetryRequest, body_required=False,
              responses={200: ("the task, Queued again", TaskView),
                         409: ("the task is not Dead or Canceled, or is pinned to a dataset "
                               "version that is no longer current (`PinnedVersionNotCurrent`, "
                               "unless `repin`)", ErrorResponse),
                         **dict([_AUTH_FAIL, _BAD_JSON, _INVALID, _TOO_LARGE, _NOT_FOUND])}),
    RouteSpec("POST", "/tasks/retry", "retry_tasks",
              "Replay Dead or Canceled tasks named by `ids` or chosen by a filter (Dead unless "
              "`status` says Canceled; at most `limit`, default 100, per call)", "api_key",
              retry_tasks, body=BulkRetryRequest,
              responses={200: ("the tasks replayed and the ids skipped", BulkRetryResponse),
                         **_BODY_ERRORS}),
    RouteSpec("GET", "/queues", "list_queues",
              "The registered queues: depth, running tasks, oldest Queued age, paused, SQS state",
              "api_key",
              list_queues, responses={200: ("every registered queue", QueueList), **_AUTH}),
    RouteSpec("GET", "/queues/{queue}", "get_queue",
              "One registered queue: depth, running tasks, oldest Queued age, paused, and "
              "whether the relay holds it because its SQS queue does not exist", "api_key",
              get_queue, path_params=("queue",),
              responses={200: ("the queue", QueueView), **_QUEUE_ERRORS}),
    RouteSpec("PUT", "/queues/{queue}/pause", "pause_queue",
              "Pause a queue: claims of its tasks answer NotClaimed Paused", "api_key",
              pause_queue, path_params=("queue",),
              responses={200: ("the queue, paused", QueueView), **_QUEUE_ERRORS}),
    RouteSpec("PUT", "/queues/{queue}/resume", "resume_queue",
              "Resume a paused queue and re-announce its Queued tasks", "api_key", resume_queue,
              path_params=("queue",),
              responses={200: ("the queue, running", QueueView), **_QUEUE_ERRORS}),
    RouteSpec("GET", "/stats", "stats",
              "Tasks by queue and state, and finishes per minute over the last hour", "api_key",
              stats, responses={200: ("the figures of the dashboard's overview", Stats), **_AUTH}),
    RouteSpec("POST", "/internal/task-claim", "task_claim", "Claim a task and obtain a lease",
              "worker_token", task_claim, body=ClaimRequest,
              responses={200: ("Claimed or NotClaimed", [ClaimedResponse, NotClaimedResponse]),
                         **_BODY_ERRORS}),
    RouteSpec("POST", "/internal/task-claim-batch", "task_claim_batch",
              "Claim up to 10 tasks in one call: one answer per task_id, in order",
              "worker_token", task_claim_batch, body=ClaimBatchRequest,
              responses={200: ("Claimed or NotClaimed per task_id", ClaimBatchResponse),
                         **_BODY_ERRORS}),
    RouteSpec("POST", "/internal/task-claim-next", "task_claim_next",
              "Claim up to `max` Queued tasks of a queue, oldest first", "worker_token",
              task_claim_next, body=ClaimNextRequest,
              responses={200: ("the tasks claimed (maybe none)", ClaimNextResponse),
                         **_BODY_ERRORS}),
    RouteSpec("GET", "/internal/task-fetch", "task_fetch", "Fetch a task's payload and status",
              "worker_token", task_fetch, query=FetchQuery,
              responses={200: ("the task payload", FetchResponse),
                         **dict([_AUTH_FAIL, _INVALID, _NOT_FOUND])}),
    RouteSpec("POST", "/internal/heartbeat", "heartbeat", "Extend the lease of the current attempt",
              "attempt", heartbeat, body=HeartbeatRequest,
              responses={200: ("lease extended", HeartbeatResponse), **_BODY_ERRORS,
                         **dict([_REJECTED, _WORKER_NOT_FOUND])}),
    RouteSpec("POST", "/internal/events", "events", "Emit upstream events of the current attempt",
              "attempt", events, body=EventsRequest,
              responses={200: ("events stored (repeats acknowledged)", EventsAcceptedResponse),
                         **_BODY_ERRORS, **dict([_REJECTED, _WORKER_NOT_FOUND])}),
    RouteSpec("POST", "/internal/steps", "steps",
              "Look up or record the result of a named step of the current attempt's task "
              "(the first recorded result wins)", "attempt", steps, body=StepRequest,
              responses={200: ("the step's stored result, or NotFound", StepResponse),
                         **_BODY_ERRORS, **dict([_REJECTED, _WORKER_NOT_FOUND])}),
    RouteSpec("POST", "/internal/task-complete", "task_complete",
              "Report the outcome of the current attempt", "attempt", task_complete,
              body=CompleteRequest,
              responses={200: ("completion accepted (or an exact repeat)", CompleteResponse),
                         **_BODY_ERRORS, **dict([_REJECTED, _WORKER_NOT_FOUND])}),
    RouteSpec("POST", "/internal/task-complete-batch", "task_complete_batch",
              "Report the outcomes of up to 10 attempts: each the status and body "
              "task-complete would answer; with `claim_next`, also claim the next tasks of a "
              "queue in the same transaction", "worker_token", task_complete_batch,
              body=CompleteBatchRequest,
              responses={200: ("one result per completion, in order", CompleteBatchResponse),
                         **_BODY_ERRORS}),
)  # fmt: skip
