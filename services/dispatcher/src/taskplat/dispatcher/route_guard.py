"""The guard around every dispatcher route, and the shape of a route's declaration (`RouteSpec`).

Invariants: public routes need an API key holding the route's scope (`route_table.SCOPES`; 401
without a valid key, 403 naming the missing scope) and internal routes the worker token (checked
before the body is read); an `operate` or `admin` call runs as an audited call: the guard makes its
`AuditCall` and the handler takes it with `audit_call(request)` and passes it on; a 401 or 403 of
such a route (the guard's or the handler's) is recorded in a transaction of its own
(`audit.record_refusal`). Every answer to a key names its scopes (`X-Taskplat-Scopes`). The routes
of a running attempt (`auth="attempt"`: heartbeat, events, steps, completion) also take that
attempt's own attempt token: the guard itself reads the body as the route's declared body model
and checks its `(task_id, attempt)` before the handler runs, however the handler then reads the
body; such a route must declare a body model with both fields (`guarded` refuses one that does
not). Any other use of an attempt token answers 403. A refused worker call is counted and logged
(`worker_call_rejected`) and a refused token logged (`request_unauthorized`, never the token
itself).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import structlog
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from taskplat.common.clock import Clock
from taskplat.common.contracts.access import Scope
from taskplat.common.errors import Forbidden, Rejected, TaskplatError, Unauthorized
from taskplat.common.logging import get_logger
from taskplat.dispatcher import audit
from taskplat.dispatcher.access import Identity, KeyStore
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.auth import authorize, bearer_token, check_attempt_scope
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.requests import (
    INLINE_BODY_BYTES,
    document_limits,
    off_loop,
    parse_body,
    validate_body,
)
from taskplat.dispatcher.requests import read_body as read_capped
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


async def _identify(request: Request) -> Identity:
    """The key of a public call (401 without a valid one)."""
    token = bearer_token(request)
    keys: KeyStore = request.app.state.keys
    identity = await keys.identify(token) if token is not None else None
    if identity is None:
        if token is not None and token.count(".") == 2:
            # A valid attempt token is a real credential, just not one for this call (403).
            authorize(request, [], what="API key", attempts=service_of(request).tokens)
        raise Unauthorized("a valid API key is required as 'Authorization: Bearer <API key>'")
    request.state.identity = identity
    return identity


def _require(identity: Identity, scope: Scope) -> None:
    """403 naming `scope` unless the key holds it."""
    if not identity.allows(scope):
        get_logger().info("request_forbidden", key=identity.name, missing_scope=scope)
        raise Forbidden(
            f"this call needs the {scope!r} scope; key {identity.name!r} has "
            f"{', '.join(sorted(identity.scopes))}",
            detail={"missing_scope": scope, "key": identity.name},
        )


async def _check_attempt_body(request: Request, spec: RouteSpec) -> None:
    """For a call made with an attempt token: the body, read as the route's declared model, must
    name that attempt (403). The bytes stay readable by the handler, whichever way it reads."""
    scope = getattr(request.state, "attempt_scope", None)
    if scope is None or spec.body is None:
        return
    raw = await read_capped(request, settings_of(request).max_body_bytes)
    # Starlette's own cache of the body: `request.body()` and `request.json()` answer from it.
    request._body = raw
    limits = document_limits(request)
    if len(raw) > INLINE_BODY_BYTES:  # as `parse_body`: a large document off the event loop
        body = await off_loop(validate_body, raw, spec.body, limits)
    else:
        body = validate_body(raw, spec.body, limits)
    check_attempt_scope(scope, body)
    request.state.body = body


async def read_body(request: Request, model: type[ModelT]) -> ModelT:
    """The body as `model` (the one the guard already read, when it did)."""
    checked = getattr(request.state, "body", None)
    if isinstance(checked, model):
        return checked
    return await parse_body(request, model, settings_of(request).max_body_bytes)


def holds(request: Request, scope: Scope) -> bool:
    """Whether the API key of this call holds `scope` (`admin` holds every scope)."""
    identity = getattr(request.state, "identity", None)
    return isinstance(identity, Identity) and identity.allows(scope)


def audit_call(request: Request) -> AuditCall:
    """The audited call of this request, made by the guard (the route needs operate or admin)."""
    call = getattr(request.state, "audit_call", None)
    if not isinstance(call, AuditCall):
        raise RuntimeError(f"{request.url.path} is not an audited route")
    return call


async def _record_refusal(
    request: Request, call: AuditCall, exc: TaskplatError, status: int
) -> None:
    clock: Clock = request.app.state.clock
    detail = exc.detail if isinstance(exc.detail, dict) else None
    await audit.record_refusal(
        request.app.state.pool,
        AuditCall(call.key_name, call.action, call.target),
        status,
        detail={"message": str(exc), **(detail or {})},
        now=clock.sql_now(),
        throttle=request.app.state.refusal_throttle,
    )


def guarded(spec: RouteSpec, scope: Scope | None = None) -> Handler:
    """Wrap a handler with its authentication check (before any body is read): the worker or
    attempt token, or an API key holding `scope`. An `operate` or `admin` call is audited, and
    its refusals too."""
    if spec.auth == "attempt" and (
        spec.body is None or not {"task_id", "attempt"} <= set(spec.body.model_fields)
    ):
        raise ValueError(f"{spec.name}: an attempt route declares a body with task_id and attempt")
    audited = spec.auth == "api_key" and scope in AUDITED_SCOPES

    async def endpoint(request: Request) -> Response:
        target = "/".join(str(value) for value in request.path_params.values()) or None
        refused = AuditCall(audit.NO_KEY, spec.name, target)
        identity: Identity | None = None
        try:
            if spec.auth == "api_key":
                identity = await _identify(request)
                refused.key_name = identity.name
                _require(identity, scope or "admin")
            else:
                _authorize(request, spec.auth)
                await _check_attempt_body(request, spec)
        except Unauthorized as exc:
            get_logger().info("request_unauthorized", method=spec.method, route=spec.path)
            if audited:
                await _record_refusal(request, refused, exc, 401)
            raise
        except Forbidden as exc:
            if audited:
                await _record_refusal(request, refused, exc, 403)
            raise
        call = AuditCall(identity.name, spec.name, target) if audited and identity else None
        request.state.audit_call = call
        try:
            response = await spec.handler(request)
        except Rejected as exc:
            _recorder(request).worker_call_rejected(spec.path, exc.reason)
            raise
        except (Unauthorized, Forbidden) as exc:
            if call is not None:
                status = 401 if isinstance(exc, Unauthorized) else 403
                await _record_refusal(request, call, exc, status)
            raise
        if call is not None and call.recorded == 0 and response.status_code < 400:
            get_logger().error("audit_missing", action=spec.name)
        if identity is not None:
            response.headers[SCOPES_HEADER] = ",".join(identity.effective_scopes())
        return response

    endpoint.__name__ = spec.name
    return endpoint
