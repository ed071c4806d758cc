"""`/openapi.json` describes exactly the served routes and every documented response schema
validates a real response; `/healthz`, `/readyz` (503 without a database) and `/metrics`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

import httpx
import pytest
from dispatcher_metrics import scrape
from pydantic import BaseModel
from starlette.routing import Mount, Route

from taskplat.common import contracts
from taskplat.testkit.dispatcher_calls import (
    INTERNAL_ROUTES,
    OPEN_ROUTES,
    PUBLIC_ROUTES,
    cancel,
    claim,
    claimed,
    complete,
    create_task,
    cursor_event,
)
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.testdb import with_database

BODY_CAP = 1024
REF_PREFIX = "#/components/schemas/"


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    return {"max_body_bytes": BODY_CAP}


def _served_routes(dispatcher: Dispatcher) -> set[tuple[str, str]]:
    assert dispatcher.app is not None
    served: set[tuple[str, str]] = set()
    for route in dispatcher.app.routes:
        if isinstance(route, Mount) and route.path == "/ui":
            continue  # the dashboard's static files, not part of the API
        assert isinstance(route, Route), route
        for method in route.methods or ():
            if method != "HEAD":  # Starlette answers HEAD for every GET route
                served.add((method, route.path))
    return served


def test_openapi_lists_exactly_the_served_routes(dispatcher: Dispatcher) -> None:
    response = dispatcher.anonymous.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    documented = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    assert documented == _served_routes(dispatcher)
    assert documented == {*PUBLIC_ROUTES, *INTERNAL_ROUTES, *OPEN_ROUTES}
    for method, path in PUBLIC_ROUTES:
        assert document["paths"][path][method.lower()]["security"] == [{"api_key": []}]
    for method, path in INTERNAL_ROUTES:
        security = document["paths"][path][method.lower()]["security"]
        attempt_routes = {
            "/internal/heartbeat",
            "/internal/events",
            "/internal/steps",
            "/internal/task-complete",
        }
        assert security == [{"attempt" if path in attempt_routes else "worker_token": []}]
    for method, path in OPEN_ROUTES:
        assert "security" not in document["paths"][path][method.lower()]


def _component_models(document: dict[str, Any]) -> dict[str, type[BaseModel]]:
    """The contract model of every schema component, checked to be what the document shows."""
    models: dict[str, type[BaseModel]] = {}
    components = document["components"]["schemas"]
    for name, schema in components.items():
        model = getattr(contracts, name, None)
        assert isinstance(model, type) and issubclass(model, BaseModel), name
        own = model.model_json_schema(ref_template=REF_PREFIX + "{model}")
        nested = own.pop("$defs", {})
        assert schema == own, f"component {name} differs from its model's schema"
        for nested_name, nested_schema in nested.items():
            assert components[nested_name] == nested_schema, nested_name
        models[name] = model
    return models


def _validate(
    response: httpx.Response, documented: dict[str, Any], models: dict[str, type[BaseModel]]
) -> None:
    content = documented.get("content", {})
    if not content:
        return
    (media_type, media) = next(iter(content.items()))
    assert response.headers["content-type"].startswith(media_type), response.headers
    schema = media.get("schema")
    if schema is None:
        if media_type == "application/json":
            response.json()
        return
    refs = [each["$ref"] for each in schema["oneOf"]] if "oneOf" in schema else [schema["$ref"]]
    matches = []
    for ref in refs:
        model = models[ref.removeprefix(REF_PREFIX)]
        try:
            model.model_validate_json(response.text)
        except ValueError:
            continue
        matches.append(model.__name__)
    assert len(matches) == 1, (refs, matches, response.text)


Producer = Callable[[Dispatcher], httpx.Response]


def _producers(dispatcher: Dispatcher) -> dict[tuple[str, str, str], list[httpx.Response]]:
    """A real response for every (method, path, status) the document names (503 aside)."""
    d = dispatcher
    task = create_task(d, idempotency_key="k")
    running = claimed(d, create_task(d)["task_id"])
    done = claimed(d, create_task(d)["task_id"])
    assert complete(d, done).status_code == 200
    canceled = create_task(d)["task_id"]
    assert cancel(d, canceled).status_code == 200
    ghost = str(uuid4())
    too_big = {"operator": "echo", "config": {"pad": "x" * BODY_CAP}}
    anonymous = d.anonymous
    out: dict[tuple[str, str, str], list[httpx.Response]] = {}

    def add(method: str, path: str, status: int, *responses: httpx.Response) -> None:
        out.setdefault((method, path, str(status)), []).extend(responses)

    for method, path in OPEN_ROUTES:
        add(method, path, 200, anonymous.request(method, path))

    add("POST", "/tasks", 201, d.api.post("/tasks", json={"operator": "echo"}))
    add("POST", "/tasks", 200, d.api.post("/tasks", json={"operator": "e", "idempotency_key": "k"}))
    add("POST", "/tasks", 400, d.api.post("/tasks", content=b"{"))
    add("POST", "/tasks", 401, anonymous.post("/tasks", json={"operator": "echo"}))
    add("POST", "/tasks", 413, d.api.post("/tasks", json=too_big))
    add("POST", "/tasks", 422, d.api.post("/tasks", json={"operator": ""}))
    add("GET", "/tasks", 200, d.api.get("/tasks"), d.api.get("/tasks", params={"limit": 1}))
    add("GET", "/tasks", 401, anonymous.get("/tasks"))
    add("GET", "/tasks", 422, d.api.get("/tasks", params={"limit": 0}))
    one = "/tasks/{task_id}"
    add("GET", one, 200, d.api.get(f"/tasks/{task['task_id']}"))
    add("GET", one, 401, anonymous.get(f"/tasks/{task['task_id']}"))
    add("GET", one, 404, d.api.get(f"/tasks/{ghost}"))
    add("GET", one, 422, d.api.get("/tasks/nope"))
    for verb, suffix, ok_id, conflict_id in (
        ("PUT", "cancel", create_task(d)["task_id"], done.task_id),
        ("POST", "retry", canceled, done.task_id),
    ):
        path = f"/tasks/{{task_id}}/{suffix}"
        add(verb, path, 200, d.api.request(verb, f"/tasks/{ok_id}/{suffix}"))
        add(verb, path, 401, anonymous.request(verb, f"/tasks/{ok_id}/{suffix}"))
        add(verb, path, 404, d.api.request(verb, f"/tasks/{ghost}/{suffix}"))
        add(verb, path, 409, d.api.request(verb, f"/tasks/{conflict_id}/{suffix}"))
        add(verb, path, 422, d.api.request(verb, f"/tasks/nope/{suffix}"))
    single_retry = "/tasks/{task_id}/retry"
    add("POST", single_retry, 400, d.api.post(f"/tasks/{done.task_id}/retry", content=b"[}"))
    add("POST", single_retry, 413,
        d.api.post(f"/tasks/{done.task_id}/retry", json={"pad": "x" * BODY_CAP}))  # fmt: skip

    claim_path = "/internal/task-claim"
    add("POST", claim_path, 200, claim(d, create_task(d)["task_id"]), claim(d, ghost))
    fetch = "/internal/task-fetch"
    add("GET", fetch, 200, d.worker.get(fetch, params={"task_id": running.task_id}))
    add("GET", fetch, 401, anonymous.get(fetch, params={"task_id": running.task_id}))
    add("GET", fetch, 404, d.worker.get(fetch, params={"task_id": ghost}))
    add("GET", fetch, 422, d.worker.get(fetch, params={"task_id": "nope"}))

    bodies = {
        claim_path: {"task_id": running.task_id, "worker_id": "w"},
        "/internal/heartbeat": running.fence(),
        "/internal/events": {**running.fence(), "events": [cursor_event(1)]},
        "/internal/steps": {**running.fence(), "step": "s", "result": 1},
        "/internal/task-complete": {**running.fence(), "status": "Completed"},
    }
    for path, body in bodies.items():
        if path != claim_path:
            stale = {**body, "lease_token": str(uuid4())}
            add("POST", path, 409, d.worker.post(path, json=stale))
            add("POST", path, 404, d.worker.post(path, json={**body, "task_id": ghost}))
        add("POST", path, 400, d.worker.post(path, content=b"[}"))
        add("POST", path, 401, anonymous.post(path, json=body))
        add("POST", path, 413, d.worker.post(path, json={**body, "pad": "x" * BODY_CAP}))
        add("POST", path, 422, d.worker.post(path, json={**body, "bogus": 1}))
    _batch_route_responses(d, add, done.fence())
    _dag_route_responses(d, add)
    _operator_route_responses(d, add)
    _access_route_responses(d, add)
    # An attempt token (of another task's attempt) is refused on every authenticated route.
    token = claim(d, create_task(d)["task_id"]).json()["attempt_token"]
    with httpx.Client(base_url=d.base_url, headers={"Authorization": f"Bearer {token}"}) as other:
        for method, template in PUBLIC_ROUTES + INTERNAL_ROUTES:
            path = template.format(
                task_id=running.task_id,
                dag_name="d",
                job="a",
                dataset_uuid=running.task_id,
                queue="default",
                name="k",
            )
            body = bodies.get(template) if method != "GET" else None
            params = {"task_id": running.task_id} if template == fetch else None
            add(method, template, 403, other.request(method, path, json=body, params=params))
    # Last: these succeed and end the running attempt.
    for path in ("/internal/heartbeat", "/internal/events", "/internal/steps",
                 "/internal/task-complete"):  # fmt: skip
        add("POST", path, 200, d.worker.post(path, json=bodies[path]))
    return out


def _batch_route_responses(
    d: Dispatcher, add: Callable[..., None], finished: dict[str, Any]
) -> None:
    """A real response of each documented status of the batch routes."""
    ghost = str(uuid4())
    batch_bodies = {
        "/tasks/batch": (d.api, 201, {"tasks": [{"operator": "echo"}]}),
        "/internal/task-claim-batch": (d.worker, 200, {"worker_id": "w", "task_ids": [ghost]}),
        "/internal/task-claim-next": (d.worker, 200, {"worker_id": "w", "queue": "none", "max": 2}),
        "/internal/task-complete-batch": (
            d.worker, 200, {"completions": [{**finished, "status": "Failed"}]},
        ),
    }  # fmt: skip
    for path, (client, ok, body) in batch_bodies.items():
        add("POST", path, ok, client.post(path, json=body))
        add("POST", path, 400, client.post(path, content=b"[}"))
        add("POST", path, 401, d.anonymous.post(path, json=body))
        add("POST", path, 413, client.post(path, json={**body, "pad": "x" * BODY_CAP}))
        add("POST", path, 422, client.post(path, json={**body, "bogus": 1}))


def _dag_route_responses(d: Dispatcher, add: Callable[..., None]) -> None:
    """A real response of each documented status of the DAG and dataset routes."""
    ghost = str(uuid4())
    anonymous = d.anonymous
    doc = {
        "jobs": {
            "a": {"operator": "echo", "outputs": [{"index": 0, "dataset": "da"}]},
            "b": {"operator": "echo", "inputs": [{"from": {"job": "a", "output_index": 0}}]},
        }
    }
    dag = "/dags/{dag_name}"
    add("PUT", dag, 201, d.api.put("/dags/p", json=doc))
    add("PUT", dag, 200, d.api.put("/dags/p", json=doc))
    add("PUT", dag, 400, d.api.put("/dags/p", content=b"{"))
    add("PUT", dag, 401, anonymous.put("/dags/p", json=doc))
    add("PUT", dag, 413, d.api.put("/dags/p", json={**doc, "pad": "x" * BODY_CAP}))
    add("PUT", dag, 422, d.api.put("/dags/p", json={**doc, "bogus": 1}))
    add("GET", "/dags", 200, d.api.get("/dags"))
    add("GET", "/dags", 401, anonymous.get("/dags"))
    add("GET", dag, 200, d.api.get("/dags/p"))
    add("GET", dag, 401, anonymous.get("/dags/p"))
    add("GET", dag, 404, d.api.get("/dags/ghost"))
    add("GET", dag, 422, d.api.get("/dags/no%20pe"))
    runs = "/dags/{dag_name}/jobs/{job}/runs"
    add("POST", runs, 201, d.api.post("/dags/p/jobs/a/runs", json={"idempotency_key": "r"}))
    add("POST", runs, 200, d.api.post("/dags/p/jobs/a/runs", json={"idempotency_key": "r"}))
    add("POST", runs, 400, d.api.post("/dags/p/jobs/a/runs", content=b"{"))
    add("POST", runs, 401, anonymous.post("/dags/p/jobs/a/runs", json={}))
    add("POST", runs, 413, d.api.post("/dags/p/jobs/a/runs", json={"pad": "x" * BODY_CAP}))
    add("POST", runs, 422, d.api.post("/dags/p/jobs/a/runs", json={"bogus": 1}))
    add("POST", runs, 404, d.api.post("/dags/p/jobs/ghost/runs", json={}))
    add("GET", "/datasets", 200, d.api.get("/datasets"))
    add("GET", "/datasets", 401, anonymous.get("/datasets"))
    dataset = d.api.get("/datasets").json()["datasets"][0]["dataset_uuid"]
    one = "/datasets/{dataset_uuid}"
    add("GET", one, 200, d.api.get(f"/datasets/{dataset}"))
    add("GET", one, 401, anonymous.get(f"/datasets/{dataset}"))
    add("GET", one, 404, d.api.get(f"/datasets/{ghost}"))
    add("GET", one, 422, d.api.get("/datasets/nope"))
    events = "/datasets/{dataset_uuid}/events"
    add("GET", events, 200, d.api.get(f"/datasets/{dataset}/events"))
    add("GET", events, 401, anonymous.get(f"/datasets/{dataset}/events"))
    add("GET", events, 404, d.api.get(f"/datasets/{ghost}/events"))
    add("GET", events, 422, d.api.get(f"/datasets/{dataset}/events", params={"limit": 0}))
    emitted = "/tasks/{task_id}/events"
    some_task = d.api.get("/tasks").json()["tasks"][0]["task_id"]
    add("GET", emitted, 200, d.api.get(f"/tasks/{some_task}/events"))
    add("GET", emitted, 401, anonymous.get(f"/tasks/{some_task}/events"))
    add("GET", emitted, 404, d.api.get(f"/tasks/{ghost}/events"))
    add("GET", emitted, 422, d.api.get("/tasks/nope/events"))
    versions = "/datasets/{dataset_uuid}/versions"
    add("POST", versions, 201, d.api.post(f"/datasets/{dataset}/versions", json={}))
    add("POST", versions, 401, anonymous.post(f"/datasets/{dataset}/versions", json={}))
    add("POST", versions, 404, d.api.post(f"/datasets/{ghost}/versions", json={}))
    add(
        "POST",
        versions,
        413,
        d.api.post(f"/datasets/{dataset}/versions", json={"pad": "x" * BODY_CAP}),
    )
    add("POST", versions, 422, d.api.post(f"/datasets/{dataset}/versions", json={"bogus": 1}))
    current = "/datasets/{dataset_uuid}/current"
    first = d.api.get(f"/datasets/{dataset}").json()["versions"][-1]["dataset_version"]
    back = {"dataset_version": first}
    add("POST", current, 200, d.api.post(f"/datasets/{dataset}/current", json=back))
    add("POST", current, 400, d.api.post(f"/datasets/{dataset}/current", content=b"{"))
    add("POST", current, 401, anonymous.post(f"/datasets/{dataset}/current", json=back))
    add("POST", current, 404, d.api.post(f"/datasets/{ghost}/current", json=back))
    add("POST", current, 413,
        d.api.post(f"/datasets/{dataset}/current", json={"pad": "x" * BODY_CAP}))  # fmt: skip
    add("POST", current, 422,
        d.api.post(f"/datasets/{dataset}/current", json={"dataset_version": ghost}))  # fmt: skip
    add("DELETE", dag, 200, d.api.delete("/dags/p"))
    add("DELETE", dag, 401, anonymous.delete("/dags/p"))
    add("DELETE", dag, 404, d.api.delete("/dags/p"))
    add("DELETE", dag, 422, d.api.delete("/dags/no%20pe"))


def _operator_route_responses(d: Dispatcher, add: Callable[..., None]) -> None:
    """A real response of each documented status of the queue, bulk replay and stats routes."""
    anonymous = d.anonymous
    for path in ("/queues", "/stats"):
        add("GET", path, 200, d.api.get(path))
        add("GET", path, 401, anonymous.get(path))
    one = "/queues/{queue}"
    add("GET", one, 200, d.api.get("/queues/default"))
    add("GET", one, 401, anonymous.get("/queues/default"))
    add("GET", one, 404, d.api.get("/queues/ghost"))
    add("GET", one, 422, d.api.get("/queues/bad%20name"))
    for action in ("pause", "resume"):
        path = f"/queues/{{queue}}/{action}"
        add("PUT", path, 200, d.api.put(f"/queues/default/{action}"))
        add("PUT", path, 401, anonymous.put(f"/queues/default/{action}"))
        add("PUT", path, 404, d.api.put(f"/queues/ghost/{action}"))
        add("PUT", path, 422, d.api.put(f"/queues/bad%20name/{action}"))
    retry = "/tasks/retry"
    add("POST", retry, 200, d.api.post(retry, json={"ids": [str(uuid4())]}))
    add("POST", retry, 400, d.api.post(retry, content=b"[}"))
    add("POST", retry, 401, anonymous.post(retry, json={}))
    add("POST", retry, 413, d.api.post(retry, json={"pad": "x" * BODY_CAP}))
    add("POST", retry, 422, d.api.post(retry, json={"limit": 0}))


def _access_route_responses(d: Dispatcher, add: Callable[..., None]) -> None:
    """A real response of each documented status of the keys, audit, workers and queue
    registration routes."""
    anonymous = d.anonymous
    add("POST", "/keys", 201, d.api.post("/keys", json={"name": "k1", "scopes": ["read"]}))
    add("POST", "/keys", 409, d.api.post("/keys", json={"name": "k1", "scopes": ["read"]}))
    add("POST", "/keys", 400, d.api.post("/keys", content=b"{"))
    add("POST", "/keys", 401, anonymous.post("/keys", json={}))
    add("POST", "/keys", 413, d.api.post("/keys", json={"pad": "x" * BODY_CAP}))
    add("POST", "/keys", 422, d.api.post("/keys", json={"name": "k2", "scopes": ["root"]}))
    add("GET", "/keys", 200, d.api.get("/keys"))
    add("GET", "/keys", 401, anonymous.get("/keys"))
    one = "/keys/{name}"
    add("DELETE", one, 200, d.api.delete("/keys/k1"))
    add("DELETE", one, 401, anonymous.delete("/keys/k1"))
    add("DELETE", one, 404, d.api.delete("/keys/k1"))
    add("DELETE", one, 422, d.api.delete("/keys/no%20pe"))
    add("GET", "/audit", 200, d.api.get("/audit"))
    add("GET", "/audit", 422, d.api.get("/audit", params={"cursor": "x"}))
    add("GET", "/audit", 401, anonymous.get("/audit"))
    add("GET", "/audit", 422, d.api.get("/audit", params={"limit": 0}))
    add("GET", "/workers", 200, d.api.get("/workers"))
    add("GET", "/workers", 401, anonymous.get("/workers"))
    queue = "/queues/{queue}"
    add("PUT", queue, 201, d.api.put("/queues/fresh"))
    add("PUT", queue, 200, d.api.put("/queues/fresh"))
    add("PUT", queue, 401, anonymous.put("/queues/fresh"))
    add("PUT", queue, 422, d.api.put("/queues/bad%20name"))
    limits = {"concurrency_limit": 2, "rate_limit": {"per_second": 5, "burst": 2}}
    add("PUT", queue, 200, d.api.put("/queues/fresh", json=limits))
    add("PUT", queue, 400, d.api.put("/queues/fresh", content=b"{"))
    add("PUT", queue, 413, d.api.put("/queues/fresh", json={"pad": "x" * BODY_CAP}))
    add("PUT", queue, 422, d.api.put("/queues/fresh", json={"concurrency_limit": 0}))


def test_every_documented_response_schema_validates_a_real_response(
    dispatcher: Dispatcher,
) -> None:
    document = dispatcher.anonymous.get("/openapi.json").json()
    models = _component_models(document)
    produced = _producers(dispatcher)
    documented = {
        (method.upper(), path, status): response
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for status, response in operation["responses"].items()
        if status != "503"
    }
    assert set(produced) == set(documented)
    for key, responses in produced.items():
        for response in responses:
            assert str(response.status_code) == key[2], (key, response.text)
            _validate(response, documented[key], models)


def test_healthz_and_readyz(dispatcher: Dispatcher) -> None:
    assert dispatcher.anonymous.get("/healthz").json() == {"status": "ok"}
    ready = dispatcher.anonymous.get("/readyz").json()
    assert ready["status"] == "ready"  # without capability keys: ready, for trusted work only
    assert ready["untrusted"]["ready"] is False


def test_readyz_answers_503_when_the_database_does_not_exist(db_url: str) -> None:
    missing = with_database(db_url, f"tp_missing_{uuid4().hex}")
    with serve_dispatcher(missing, db_connect_timeout_seconds=0.5, db_pool_min_size=1) as broken:
        assert broken.anonymous.get("/healthz").status_code == 200
        ready = broken.anonymous.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert ready.json()["status"] == "unavailable"
        # A route that needs the database answers 503 too, never 500.
        listing = broken.api.get("/tasks")
        assert listing.status_code == 503, listing.text
        assert listing.json()["error"] == "unavailable"
        document = broken.anonymous.get("/openapi.json").json()
        assert "503" in document["paths"]["/readyz"]["get"]["responses"]


def test_metrics_show_unfinished_task_counts_by_queue_and_status(dispatcher: Dispatcher) -> None:
    for _ in range(2):
        create_task(dispatcher, queue="alpha")
    claimed(dispatcher, create_task(dispatcher, queue="alpha")["task_id"])
    later = (dispatcher.clock.now().replace(year=2031)).isoformat()
    create_task(dispatcher, queue="beta", scheduled_for=later)
    assert cancel(dispatcher, create_task(dispatcher, queue="beta")["task_id"]).status_code == 200

    metrics = scrape(dispatcher)
    # Terminal statuses are not gauges (their counters are): only what is still to do.
    assert metrics.series("taskplat_tasks_current", "queue", "status") == {
        ("alpha", "Queued"): 2,
        ("alpha", "Running"): 1,
        ("beta", "Scheduled"): 1,
    }
    assert "# TYPE taskplat_tasks_current gauge" in metrics.text
