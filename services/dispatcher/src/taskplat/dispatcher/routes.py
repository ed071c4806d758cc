"""Every HTTP route of the dispatcher, declared once: the handlers and the OpenAPI document are
both built from `ROUTES`.

Invariants: public routes need an API key holding the route's scope (`route_table.SCOPES`; 401
without a valid key, 403 naming the missing scope) and internal routes the worker token (checked
before the body is read); an `operate` or `admin` call runs as an audited call (`audit`) and every
answer to a key names its scopes (`X-Taskplat-Scopes`); the routes of a running attempt
(`auth="attempt"`: heartbeat, events, completion) also take that attempt's own attempt token,
checked against the body's `(task_id, attempt)` as it is parsed, and any other use of an attempt
token answers 403 (adding an attempt's route, such as steps, is one `RouteSpec` with
`auth="attempt"` whose body names `task_id` and `attempt`).
Health, readiness, metrics and the OpenAPI document are open. A handler validates the whole
request before it calls the service, so invalid input never writes. A handler binds the
task it acts on (`task_id`, `attempt`, `worker_id`) to the request's log context; a refused worker
call is counted and logged (`worker_call_rejected`) and a refused token logged
(`request_unauthorized`, never the token itself). A worker's report of itself (`worker` on
claim-next and heartbeat) is stored only when the worker token made the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal, TypeVar

import structlog
from pydantic import AwareDatetime, BaseModel, Field
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
from taskplat.common.contracts.access import Scope, WorkerReport
from taskplat.common.contracts.base import Contract, OperatorName, QueueName
from taskplat.common.errors import Forbidden, Rejected, Unauthorized
from taskplat.common.logging import get_logger
from taskplat.dispatcher import audit
from taskplat.dispatcher.access import Identity, KeyStore
from taskplat.dispatcher.access_service import AccessService
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.auth import authorize, bearer_token, check_attempt_scope
from taskplat.dispatcher.errors import json_response
from taskplat.dispatcher.operations import Operations
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.requests import parse_body, parse_query, parse_queue_name, parse_uuid
from taskplat.dispatcher.service import TaskService
from taskplat.dispatcher.service_rules import ListFilters
from taskplat.dispatcher.settings import DispatcherSettings

ModelT = TypeVar("ModelT", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
# `attempt`: the worker token, or the attempt token of the very (task_id, attempt) the body names.
Auth = Literal["api_key", "worker_token", "attempt", "none"]
AUDITED_SCOPES: frozenset[Scope | None] = frozenset({"operate", "admin"})
# Every answer to an API key names the key's scopes (the dashboard hides what it may not do).
SCOPES_HEADER = "X-Taskplat-Scopes"


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


@dataclass(frozen=True)
class RouteSpec:
    method: str
    path: str
    name: str
    summary: str
    auth: Auth
    handler: Handler
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    path_params: tuple[str, ...] = ()
    responses: dict[int, tuple[str, type[BaseModel] | list[type[BaseModel]] | None]] = field(
        default_factory=dict
    )
    body_media_types: tuple[str, ...] = ("application/json",)
    body_required: bool = True


def _service(request: Request) -> TaskService:
    service: TaskService = request.app.state.service
    return service


def _operations(request: Request) -> Operations:
    operations: Operations = request.app.state.operations
    return operations


def _recorder(request: Request) -> Recorder:
    recorder: Recorder = request.app.state.recorder
    return recorder


def _bind(**fields: object) -> None:
    """Add the task a request acts on to its log context."""
    structlog.contextvars.bind_contextvars(
        **{key: str(value) if key == "task_id" else value for key, value in fields.items()}
    )


def _settings(request: Request) -> DispatcherSettings:
    settings: DispatcherSettings = request.app.state.settings
    return settings


settings_of = _settings
bind_log_fields = _bind


def _authorize(request: Request, auth: Auth) -> None:
    """The worker-token and attempt-token checks (API keys: `_identify`)."""
    settings = _settings(request)
    if auth in ("worker_token", "attempt"):
        scope = authorize(
            request,
            [settings.worker_token],
            what="worker token",
            attempts=_service(request).tokens,
            attempt_scoped=auth == "attempt",
        )
        request.state.attempt_scope = scope


async def _identify(request: Request, scope: Scope) -> Identity:
    """The key of a public call (401 without a valid one), which must hold `scope` (403)."""
    token = bearer_token(request)
    keys: KeyStore = request.app.state.keys
    identity = await keys.identify(token) if token is not None else None
    if identity is None:
        if token is not None and token.count(".") == 2:
            # A valid attempt token is a real credential, just not one for this call (403).
            authorize(request, [], what="API key", attempts=_service(request).tokens)
        raise Unauthorized("a valid API key is required as 'Authorization: Bearer <API key>'")
    if not identity.allows(scope):
        get_logger().info("request_forbidden", key=identity.name, missing_scope=scope)
        raise Forbidden(
            f"this call needs the {scope!r} scope; key {identity.name!r} has "
            f"{', '.join(sorted(identity.scopes))}",
            detail={"missing_scope": scope, "key": identity.name},
        )
    request.state.identity = identity
    return identity


async def _body(request: Request, model: type[ModelT]) -> ModelT:
    body = await parse_body(request, model, _settings(request).max_body_bytes)
    check_attempt_scope(getattr(request.state, "attempt_scope", None), body)
    return body


# ---- public ------------------------------------------------------------------------------


async def create_task(request: Request) -> Response:
    body = await _body(request, CreateTaskRequest)
    view, created = await _service(request).create(body)
    return json_response(view, 201 if created else 200)


async def create_tasks(request: Request) -> Response:
    body = await _body(request, CreateTasksRequest)
    return json_response(await _service(request).create_many(body), 201)


async def list_tasks(request: Request) -> Response:
    query = parse_query(request, ListTasksQuery)
    limit = min(query.limit, _settings(request).list_max_limit)
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
    return json_response(await _service(request).list(filters))


async def get_task(request: Request) -> Response:
    task_id = parse_uuid(request.path_params["task_id"], name="task_id")
    _bind(task_id=task_id)
    return json_response(await _service(request).get(task_id))


async def cancel_task(request: Request) -> Response:
    task_id = parse_uuid(request.path_params["task_id"], name="task_id")
    _bind(task_id=task_id)
    return json_response(await _service(request).cancel(task_id))


async def retry_task(request: Request) -> Response:
    task_id = parse_uuid(request.path_params["task_id"], name="task_id")
    _bind(task_id=task_id)
    body = await parse_body(request, RetryRequest, _settings(request).max_body_bytes, optional=True)
    return json_response(await _service(request).replay(task_id, repin=body.repin))


async def retry_tasks(request: Request) -> Response:
    body = await _body(request, BulkRetryRequest)
    return json_response(await _operations(request).replay_many(body))


async def list_queues(request: Request) -> Response:
    return json_response(await _operations(request).queues())


async def pause_queue(request: Request) -> Response:
    queue = parse_queue_name(request.path_params["queue"])
    return json_response(await _operations(request).pause(queue))


async def resume_queue(request: Request) -> Response:
    queue = parse_queue_name(request.path_params["queue"])
    return json_response(await _operations(request).resume(queue))


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
    body = await _body(request, ClaimRequest)
    _bind(task_id=body.task_id, worker_id=body.worker_id)
    return json_response(await _service(request).claim(body))


async def task_claim_batch(request: Request) -> Response:
    body = await _body(request, ClaimBatchRequest)
    _bind(worker_id=body.worker_id)
    return json_response(await _service(request).claim_batch(body))


async def task_claim_next(request: Request) -> Response:
    body = await _body(request, ClaimNextRequest)
    _bind(worker_id=body.worker_id)
    await _report_worker(request, body.worker)
    if body.wait_seconds <= 0:
        return json_response(await _service(request).claim_next(body))
    # The body is read: the next ASGI message is the client's disconnect.
    gone: asyncio.Future[object] = asyncio.ensure_future(request.receive())
    try:
        return json_response(await _service(request).claim_next(body, gone))
    finally:
        gone.cancel()


async def task_fetch(request: Request) -> Response:
    query = parse_query(request, FetchQuery)
    task_id = parse_uuid(query.task_id, name="task_id", where="query")
    _bind(task_id=task_id)
    return json_response(await _service(request).fetch(task_id))


async def heartbeat(request: Request) -> Response:
    body = await _body(request, HeartbeatRequest)
    _bind(task_id=body.task_id, attempt=body.attempt)
    await _report_worker(request, body.worker)
    return json_response(await _service(request).heartbeat(body))


async def events(request: Request) -> Response:
    body = await _body(request, EventsRequest)
    _bind(task_id=body.task_id, attempt=body.attempt)
    return json_response(await _service(request).events(body))


async def steps(request: Request) -> Response:
    body = await _body(request, StepRequest)
    _bind(task_id=body.task_id, attempt=body.attempt)
    return json_response(await _service(request).step(body))


async def task_complete(request: Request) -> Response:
    body = await _body(request, CompleteRequest)
    _bind(task_id=body.task_id, attempt=body.attempt)
    return json_response(await _service(request).complete(body))


async def task_complete_batch(request: Request) -> Response:
    body = await _body(request, CompleteBatchRequest)
    return json_response(await _service(request).complete_batch(body))


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
              "The registered queues: depth, running tasks, oldest Queued age, paused", "api_key",
              list_queues, responses={200: ("every registered queue", QueueList), **_AUTH}),
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
              "task-complete would answer", "worker_token", task_complete_batch,
              body=CompleteBatchRequest,
              responses={200: ("one result per completion, in order", CompleteBatchResponse),
                         **_BODY_ERRORS}),
)  # fmt: skip


def guarded(spec: RouteSpec, scope: Scope | None = None) -> Handler:
    """Wrap a handler with its authentication check (before any body is read): the worker or
    attempt token, or an API key holding `scope`. An `operate` or `admin` call is audited."""

    async def endpoint(request: Request) -> Response:
        identity: Identity | None = None
        try:
            if spec.auth == "api_key":
                identity = await _identify(request, scope or "admin")
            else:
                _authorize(request, spec.auth)
        except Unauthorized:
            get_logger().info("request_unauthorized", method=spec.method, route=spec.path)
            raise
        call: AuditCall | None = None
        if identity is not None and scope in AUDITED_SCOPES:
            target = "/".join(str(value) for value in request.path_params.values()) or None
            call = AuditCall(identity.name, spec.name, target)
        token = audit.begin(call) if call is not None else None
        try:
            response = await spec.handler(request)
        except Rejected as exc:
            _recorder(request).worker_call_rejected(spec.path, exc.reason)
            raise
        finally:
            if token is not None:
                audit.end(token)
        if call is not None and call.recorded == 0 and response.status_code < 400:
            get_logger().error("audit_missing", action=spec.name)
        if identity is not None:
            response.headers[SCOPES_HEADER] = ",".join(identity.effective_scopes())
        return response

    endpoint.__name__ = spec.name
    return endpoint
