"""The guard around every dispatcher route, and the shape of a route's declaration (`RouteSpec`).

Invariants: public routes need an API key holding the route's scope (`route_table.SCOPES`; 401
without a valid key, 403 naming the missing scope) and internal routes the worker token (checked
before the body is read); an `operate` or `admin` call runs as an audited call (`audit`) and every
answer to a key names its scopes (`X-Taskplat-Scopes`); the routes of a running attempt
(`auth="attempt"`: heartbeat, events, completion) also take that attempt's own attempt token,
checked against the body's `(task_id, attempt)` as it is parsed (`read_body`), and any other use
of an attempt token answers 403 (adding an attempt's route, such as steps, is one `RouteSpec`
with `auth="attempt"` whose body names `task_id` and `attempt`). A refused worker call is counted
and logged (`worker_call_rejected`) and a refused token logged (`request_unauthorized`, never the
token itself).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import structlog
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from taskplat.common.contracts.access import Scope
from taskplat.common.errors import Forbidden, Rejected, Unauthorized
from taskplat.common.logging import get_logger
from taskplat.dispatcher import audit
from taskplat.dispatcher.access import Identity, KeyStore
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.auth import authorize, bearer_token, check_attempt_scope
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.requests import parse_body
from taskplat.dispatcher.service import TaskService
from taskplat.dispatcher.settings import DispatcherSettings

ModelT = TypeVar("ModelT", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
# `attempt`: the worker token, or the attempt token of the very (task_id, attempt) the body names.
Auth = Literal["api_key", "worker_token", "attempt", "none"]
AUDITED_SCOPES: frozenset[Scope | None] = frozenset({"operate", "admin"})
# Every answer to an API key names the key's scopes (the dashboard hides what it may not do).
SCOPES_HEADER = "X-Taskplat-Scopes"


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


def service_of(request: Request) -> TaskService:
    service: TaskService = request.app.state.service
    return service


def _recorder(request: Request) -> Recorder:
    recorder: Recorder = request.app.state.recorder
    return recorder


def bind_log_fields(**fields: object) -> None:
    """Add the task a request acts on to its log context."""
    structlog.contextvars.bind_contextvars(
        **{key: str(value) if key == "task_id" else value for key, value in fields.items()}
    )


def settings_of(request: Request) -> DispatcherSettings:
    settings: DispatcherSettings = request.app.state.settings
    return settings


def _authorize(request: Request, auth: Auth) -> None:
    """The worker-token and attempt-token checks (API keys: `_identify`)."""
    settings = settings_of(request)
    if auth in ("worker_token", "attempt"):
        scope = authorize(
            request,
            [settings.worker_token],
            what="worker token",
            attempts=service_of(request).tokens,
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
            authorize(request, [], what="API key", attempts=service_of(request).tokens)
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


async def read_body(request: Request, model: type[ModelT]) -> ModelT:
    body = await parse_body(request, model, settings_of(request).max_body_bytes)
    check_attempt_scope(getattr(request.state, "attempt_scope", None), body)
    return body


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
