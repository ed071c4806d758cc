"""Every public route needs the API key and every internal route the worker token (401 and
nothing written otherwise); the operational routes are open."""

from __future__ import annotations

from typing import Any

import httpx

from taskplat.testkit.dispatcher_calls import (
    INTERNAL_ROUTES,
    OPEN_ROUTES,
    PUBLIC_ROUTES,
    claimed,
    create_task,
    cursor_event,
)
from taskplat.testkit.dispatcher_harness import API_KEY, WORKER_TOKEN, Dispatcher
from taskplat.testkit.dispatcher_rows import row_counts, task_state


def _valid_request(method: str, path: str, task_id: str, fence: dict[str, Any]) -> dict[str, Any]:
    """Arguments of a request that the right token would make succeed (and write)."""
    bodies: dict[str, dict[str, Any]] = {
        "/tasks": {"operator": "echo"},
        "/internal/task-claim": {"task_id": task_id, "worker_id": "w"},
        "/internal/heartbeat": fence,
        "/internal/task-complete": {**fence, "status": "Completed"},
        "/internal/events": {**fence, "events": [cursor_event(1)]},
        "/internal/steps": {**fence, "step": "s", "result": 1},
        "/dags/{dag_name}": {"jobs": {"a": {"operator": "echo"}}},
        "/dags/{dag_name}/jobs/{job}/runs": {},
        "/tasks/retry": {"ids": [task_id]},
    }
    url = path.format(
        task_id=task_id, dag_name="d", job="a", dataset_uuid=task_id, queue="default", name="k"
    )
    request: dict[str, Any] = {"method": method, "url": url}
    if method in ("POST", "PUT") and path in bodies:
        request["json"] = bodies[path]
    if path == "/internal/task-fetch":
        request["params"] = {"task_id": task_id}
    return request


def test_every_public_and_internal_route_refuses_a_missing_or_wrong_token(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    before = task_state(db_url, lease.task_id)
    counts = row_counts(db_url)
    wrong_headers: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Basic {API_KEY}"},
        {"Authorization": API_KEY},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer  x"},
        {"Authorization": f"Bearer {API_KEY}x"},
        {"Authorization": f"Bearer {API_KEY[:-1]}"},
    ]
    routes = [(route, WORKER_TOKEN) for route in PUBLIC_ROUTES] + [
        (route, API_KEY) for route in INTERNAL_ROUTES
    ]
    with httpx.Client(base_url=dispatcher.base_url, timeout=30) as client:
        for (method, path), other_kind in routes:
            request = _valid_request(method, path, lease.task_id, lease.fence())
            # The other kind of credential is as wrong as no credential.
            for headers in [*wrong_headers, {"Authorization": f"Bearer {other_kind}"}]:
                response = client.request(**request, headers=headers)
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.json()["error"] == "unauthorized"
                assert response.headers["www-authenticate"] == "Bearer"
                assert API_KEY not in response.text and WORKER_TOKEN not in response.text
    assert task_state(db_url, lease.task_id) == before
    assert row_counts(db_url) == counts


def test_the_bearer_scheme_is_case_insensitive(dispatcher: Dispatcher) -> None:
    with httpx.Client(base_url=dispatcher.base_url, timeout=30) as client:
        response = client.get("/tasks", headers={"Authorization": f"bearer {API_KEY}"})
        assert response.status_code == 200, response.text


def test_open_routes_need_no_token(dispatcher: Dispatcher) -> None:
    for method, path in OPEN_ROUTES:
        response = dispatcher.anonymous.request(method, path)
        assert response.status_code == 200, (path, response.text)
        # A wrong token does not matter there either.
        response = dispatcher.anonymous.request(
            method, path, headers={"Authorization": "Bearer nonsense"}
        )
        assert response.status_code == 200, (path, response.text)
