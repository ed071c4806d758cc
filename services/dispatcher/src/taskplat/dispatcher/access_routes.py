"""The public routes of access and the fleet: keys, the audit log, the workers and queue
registration.

Invariants: every route needs an API key holding the scope `route_table.SCOPES` names (keys,
queue registration and limits: `admin`); a key's secret is in one answer only, that of
`POST /keys`; path names and a queue's limits are validated before any work (a bad body changes
nothing); no body on `PUT /queues/{queue}` leaves the queue's limits as they are.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AwareDatetime, Field
from starlette.requests import Request
from starlette.responses import Response

from taskplat.common.contracts import ErrorResponse, QueueLimits, QueueView
from taskplat.common.contracts.access import (
    AuditList,
    KeyCreated,
    KeyCreateRequest,
    KeyList,
    RevokedKey,
    WorkerList,
)
from taskplat.common.contracts.base import Contract
from taskplat.common.errors import ValidationFailed
from taskplat.dispatcher.access import Identity
from taskplat.dispatcher.access_service import AccessService
from taskplat.dispatcher.errors import json_response
from taskplat.dispatcher.requests import (
    document_limits,
    parse_body,
    parse_query,
    parse_queue_name,
    read_body,
    validate_body,
)
from taskplat.dispatcher.route_guard import RouteSpec, audit_call, settings_of

_KEY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class AuditQuery(Contract):
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    key: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    action: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    target: Annotated[str, Field(min_length=1, max_length=300)] | None = None
    # The next page's cursor as GET /audit answered it: an audit row id.
    cursor: Annotated[str, Field(pattern=r"^[0-9]{1,19}$")] | None = None
    limit: Annotated[int, Field(ge=1, le=500)] = 100


def _access(request: Request) -> AccessService:
    service: AccessService = request.app.state.access
    return service


async def create_key(request: Request) -> Response:
    body = await parse_body(request, KeyCreateRequest, settings_of(request).max_body_bytes)
    identity: Identity = request.state.identity
    return json_response(
        await _access(request).create_key(body, identity, audit_call(request)), 201
    )


async def list_keys(request: Request) -> Response:
    return json_response(await _access(request).list_keys(audit_call(request)))


async def revoke_key(request: Request) -> Response:
    name = str(request.path_params["name"])
    if not _KEY_NAME.match(name):
        raise ValidationFailed(
            "name must be 1-64 letters, digits, '_', '.' or '-'",
            detail=[{"loc": ["path", "name"], "msg": "invalid name", "type": "name"}],
        )
    return json_response(await _access(request).revoke_key(name, audit_call(request)))


async def list_audit(request: Request) -> Response:
    query = parse_query(request, AuditQuery)
    page = await _access(request).audit_log(
        since=query.since,
        until=query.until,
        key=query.key,
        action=query.action,
        target=query.target,
        cursor=query.cursor,
        limit=query.limit,
        call=audit_call(request),
    )
    return json_response(page)


async def list_workers(request: Request) -> Response:
    return json_response(await _access(request).workers())


async def register_queue(request: Request) -> Response:
    queue = parse_queue_name(request.path_params["queue"])
    # No body registers the queue and leaves its limits as they are; a body replaces them.
    raw = await read_body(request, settings_of(request).max_body_bytes)
    limits = validate_body(raw, QueueLimits, document_limits(request)) if raw.strip() else None
    view, created = await _access(request).register_queue(queue, limits, audit_call(request))
    return json_response(view, 201 if created else 200)


_AUTH_FAIL = (401, ("missing or wrong bearer token", ErrorResponse))
_BAD_JSON = (400, ("malformed JSON", ErrorResponse))
_INVALID = (422, ("the request does not match the contract", ErrorResponse))
_TOO_LARGE = (413, ("request body over the size cap", ErrorResponse))
_AUTH = dict([_AUTH_FAIL])

ACCESS_ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("POST", "/keys", "create_key",
              "Create an API key of the given scopes; its secret is answered only here",
              "api_key", create_key, body=KeyCreateRequest,
              responses={201: ("the key and its secret (shown once)", KeyCreated),
                         409: ("a key of this name exists", ErrorResponse),
                         **_AUTH, **dict([_BAD_JSON, _INVALID, _TOO_LARGE])}),
    RouteSpec("GET", "/keys", "list_keys", "The stored API keys (names and scopes, no secrets)",
              "api_key", list_keys, responses={200: ("every stored key", KeyList), **_AUTH}),
    RouteSpec("DELETE", "/keys/{name}", "revoke_key",
              "Revoke an API key (every replica refuses it within `key_cache_seconds`)",
              "api_key", revoke_key, path_params=("name",),
              responses={200: ("revoked", RevokedKey),
                         404: ("no such key", ErrorResponse), **_AUTH, **dict([_INVALID])}),
    RouteSpec("GET", "/audit", "list_audit",
              "The audit log of operate and admin calls, newest first", "api_key", list_audit,
              query=AuditQuery,
              responses={200: ("one page of the audit log", AuditList),
                         **_AUTH, **dict([_INVALID])}),
    RouteSpec("GET", "/workers", "list_workers",
              "The workers seen lately: queues, slots, version, running tasks, last seen",
              "api_key", list_workers, responses={200: ("the workers", WorkerList), **_AUTH}),
    RouteSpec("PUT", "/queues/{queue}", "register_queue",
              "Register a queue (tasks may name it at once, on every replica); a body replaces "
              "its limits (no body leaves them as they are)", "api_key",
              register_queue, path_params=("queue",), body=QueueLimits, body_required=False,
              responses={201: ("the queue, registered", QueueView),
                         200: ("the queue was already registered", QueueView),
                         **_AUTH, **dict([_BAD_JSON, _INVALID, _TOO_LARGE])}),
)  # fmt: skip
