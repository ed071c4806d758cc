"""Scoped API keys: every public route of the OpenAPI document refuses a key without its scope
(403 naming it, nothing written) and serves one with it; keys are created once, listed without
secrets and revoked; the bootstrap keys are admin; no key reaches a log line; every answer carries
the security headers."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import structlog

from taskplat.common.logging import configure_logging
from taskplat.dispatcher.route_table import SCOPES
from taskplat.testkit.dispatcher_calls import create_task
from taskplat.testkit.dispatcher_harness import API_KEY, Dispatcher
from taskplat.testkit.dispatcher_rows import row_counts

ALL_SCOPES = ("read", "submit", "operate", "admin")


def new_key(dispatcher: Dispatcher, name: str, *scopes: str) -> str:
    response = dispatcher.api.post("/keys", json={"name": name, "scopes": list(scopes)})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["name"] == name and sorted(body["scopes"]) == sorted(set(scopes))
    key: str = body["key"]
    return key


def client(dispatcher: Dispatcher, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=dispatcher.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def _request(method: str, path: str, task_id: str) -> dict[str, Any]:
    url = path.format(
        task_id=task_id, dag_name="d", job="a", dataset_uuid=task_id, queue="default", name="k"
    )
    request: dict[str, Any] = {"method": method, "url": url}
    if method in ("POST", "PUT"):
        request["json"] = {}
    return request


def test_every_public_route_names_a_scope_and_refuses_a_key_without_it(
    dispatcher: Dispatcher, db_url: str
) -> None:
    document = dispatcher.anonymous.get("/openapi.json").json()
    public = [
        (method.upper(), path, operation)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if operation.get("security") == [{"api_key": []}]
    ]
    assert len(public) >= 27
    task_id = create_task(dispatcher)["task_id"]
    only = {scope: new_key(dispatcher, f"only-{scope}", scope) for scope in ALL_SCOPES}
    # Every scope but one (admin holds them all, so it is never in a key that lacks one).
    lacking = {
        scope: new_key(
            dispatcher, f"no-{scope}", *[s for s in ALL_SCOPES if s not in (scope, "admin")]
        )
        for scope in ALL_SCOPES
    }
    for method, path, operation in public:
        name = operation["operationId"]
        assert name in SCOPES, f"route {name} ({method} {path}) declares no scope"
        scope = operation["x-taskplat-scope"]
        assert scope == SCOPES[name]
        assert "403" in operation["responses"]
        counts = row_counts(db_url)
        with client(dispatcher, lacking[scope]) as refused:
            response = refused.request(**_request(method, path, task_id))
        assert response.status_code == 403, (method, path, response.text)
        body = response.json()
        assert body["error"] == "forbidden" and body["detail"]["missing_scope"] == scope
        assert repr(scope) in body["message"]
        assert row_counts(db_url) == counts, (method, path)
        with client(dispatcher, only[scope]) as allowed:
            response = allowed.request(**_request(method, path, task_id))
        assert response.status_code not in (401, 403), (method, path, response.text)
        if response.status_code < 400:  # the key's scopes, for the dashboard
            assert response.headers["x-taskplat-scopes"] == (
                "read,submit,operate,admin" if scope == "admin" else scope
            )


def test_a_key_is_shown_once_listed_without_its_secret_and_revoked(
    dispatcher: Dispatcher,
) -> None:
    key = new_key(dispatcher, "viewer", "read")
    assert key.startswith("tpk_") and len(key) > 40
    listed = dispatcher.api.get("/keys")
    assert listed.status_code == 200
    assert key not in listed.text
    (view,) = [k for k in listed.json()["keys"] if k["name"] == "viewer"]
    assert view["scopes"] == ["read"] and view["created_by"] == "bootstrap"
    again = dispatcher.api.post("/keys", json={"name": "viewer", "scopes": ["admin"]})
    assert again.status_code == 409
    reserved = dispatcher.api.post("/keys", json={"name": "bootstrap-2", "scopes": ["read"]})
    assert reserved.status_code == 422
    with client(dispatcher, key) as viewer:
        assert viewer.get("/tasks").status_code == 200
        assert viewer.post("/tasks", json={"operator": "echo"}).status_code == 403
        assert viewer.get("/keys").status_code == 403
        assert dispatcher.api.delete("/keys/viewer").status_code == 200
        # The revoking replica forgets its cached lookup at once.
        refused = viewer.get("/tasks")
        assert refused.status_code == 401
        assert key not in refused.text
    assert dispatcher.api.delete("/keys/viewer").status_code == 404


def test_a_stored_key_with_admin_manages_keys(dispatcher: Dispatcher) -> None:
    admin = new_key(dispatcher, "ops-admin", "admin")
    with client(dispatcher, admin) as ops:
        made = ops.post("/keys", json={"name": "made-by-ops", "scopes": ["submit"]})
        assert made.status_code == 201
        by_name = {k["name"]: k for k in ops.get("/keys").json()["keys"]}
        assert by_name["made-by-ops"]["created_by"] == "ops-admin"
        assert ops.put("/queues/brand-new").status_code == 201


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    saved = structlog.get_config()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        configure_logging("dispatcher", level="DEBUG", fmt="json")
    try:
        yield buffer
    finally:
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def test_no_key_reaches_a_log_line(dispatcher: Dispatcher, json_logs: io.StringIO) -> None:
    key = new_key(dispatcher, "logged", "read")
    with client(dispatcher, key) as viewer:
        assert viewer.post("/tasks", json={"operator": "echo"}).status_code == 403
        assert viewer.get("/tasks").status_code == 200
    with client(dispatcher, key + "x") as wrong:
        assert wrong.get("/tasks").status_code == 401
    assert dispatcher.api.delete("/keys/logged").status_code == 200
    text = json_logs.getvalue()
    assert "request_forbidden" in text and "api_key_created" in text
    assert key not in text and key[4:20] not in text and API_KEY not in text


def test_every_answer_carries_the_security_headers(dispatcher: Dispatcher) -> None:
    for path in ("/tasks", "/ui/", "/ui/app.js", "/healthz", "/nowhere"):
        response = dispatcher.api.get(path)
        policy = response.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy
        if path.startswith("/ui/"):
            assert response.status_code == 200
            assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        else:
            assert policy.startswith("default-src 'none'")
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
