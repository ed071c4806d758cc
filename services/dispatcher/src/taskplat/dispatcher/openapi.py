"""The OpenAPI 3.1 document, generated from the route table and the pydantic contracts.

Invariant: the document is derived from `ALL_ROUTES`, the same table the app is built from, so it
names exactly the routes that exist with the request and response models their handlers use.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from taskplat.common.contracts import ErrorResponse
from taskplat.dispatcher.route_guard import RouteSpec
from taskplat.dispatcher.route_table import ALL_ROUTES, scope_of

_REF_TEMPLATE = "#/components/schemas/{model}"
_UUID_SCHEMA = {"type": "string", "format": "uuid"}
_NAME_SCHEMA = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,100}$"}
_PATH_SCHEMAS: dict[str, dict[str, Any]] = {
    "queue": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "maxLength": 64},
    "dag_name": _NAME_SCHEMA,
    "job": _NAME_SCHEMA,
}


def _models() -> list[type[BaseModel]]:
    seen: dict[str, type[BaseModel]] = {}
    for spec in ALL_ROUTES:
        candidates: list[type[BaseModel]] = []
        if spec.body:
            candidates.append(spec.body)
        for _, model in spec.responses.values():
            if isinstance(model, list):
                candidates.extend(model)
            elif model is not None:
                candidates.append(model)
        for model in candidates:
            seen[model.__name__] = model
    seen[ErrorResponse.__name__] = ErrorResponse
    return list(seen.values())


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF_TEMPLATE.format(model=model.__name__)}


def _parameters(spec: RouteSpec) -> list[dict[str, Any]]:
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": _PATH_SCHEMAS.get(name, _UUID_SCHEMA),
        }
        for name in spec.path_params
    ]
    if spec.query is not None:
        schema = spec.query.model_json_schema()
        required = set(schema.get("required", []))
        for name, prop in schema["properties"].items():
            parameters.append(
                {"name": name, "in": "query", "required": name in required, "schema": prop}
            )
    return parameters


def _operation(spec: RouteSpec) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": spec.name, "summary": spec.summary}
    if spec.auth != "none":
        operation["security"] = [{spec.auth: []}]
    scope = scope_of(spec)
    if scope is not None:
        operation["x-taskplat-scope"] = scope
    parameters = _parameters(spec)
    if parameters:
        operation["parameters"] = parameters
    if spec.body is not None:
        operation["requestBody"] = {
            "required": spec.body_required,
            "content": {media: {"schema": _ref(spec.body)} for media in spec.body_media_types},
        }
    documented = dict(spec.responses)
    if scope is not None:  # an API key without the route's scope
        documented[403] = (
            f"the API key lacks the {scope!r} scope (`detail.missing_scope`), or an attempt "
            "token was used",
            ErrorResponse,
        )
    elif spec.auth != "none":  # every authenticated route refuses a misused attempt token
        documented[403] = ("an attempt token used outside its own attempt's calls", ErrorResponse)
    responses: dict[str, Any] = {}
    for status, (description, model) in sorted(documented.items()):
        response: dict[str, Any] = {"description": description}
        if isinstance(model, list):
            schema: dict[str, Any] = {"oneOf": [_ref(each) for each in model]}
            response["content"] = {"application/json": {"schema": schema}}
        elif model is not None:
            response["content"] = {"application/json": {"schema": _ref(model)}}
        responses[str(status)] = response
    # Every route reads or writes Postgres: when it is unreachable the route answers 503.
    responses["503"] = {
        "description": "the database is unavailable; retry later",
        "content": {"application/json": {"schema": _ref(ErrorResponse)}},
    }
    operation["responses"] = responses
    return operation


def _open_paths() -> dict[str, Any]:
    def plain(summary: str, ok: str, media: str = "application/json") -> dict[str, Any]:
        return {"get": {"summary": summary, "responses": {"200": {
            "description": ok, "content": {media: {}}}}}}  # fmt: skip

    ready = plain(
        "Readiness: 200 when Postgres answers; `untrusted.ready` false when untrusted work is "
        "not handed out (no capability keys; `untrusted.setting` names the missing setting)",
        "ready",
    )
    ready["get"]["responses"]["503"] = {"description": "the database is unavailable"}
    return {
        "/healthz": plain("Liveness", "the process serves"),
        "/readyz": ready,
        "/metrics": plain("Prometheus metrics", "metrics", "text/plain"),
        "/openapi.json": plain("This document", "OpenAPI 3.1 document"),
    }


def build_openapi() -> dict[str, Any]:
    _, definitions = models_json_schema(
        [(model, "validation") for model in _models()], ref_template=_REF_TEMPLATE
    )
    paths: dict[str, Any] = _open_paths()
    for spec in ALL_ROUTES:
        paths.setdefault(spec.path, {})[spec.method.lower()] = _operation(spec)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Taskplat dispatcher", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {
                "api_key": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "API key; each operation names the scope it needs "
                    "(`x-taskplat-scope`: read, submit, operate or admin; admin holds all)",
                },
                "worker_token": {"type": "http", "scheme": "bearer", "description": "Worker token"},
                "attempt": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Worker token, or the attempt token of the (task_id, attempt) "
                    "the body names",
                },
            },
        },
    }
