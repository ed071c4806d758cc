"""HTTP calls of the dispatcher's tests: small builders for the public and worker requests.

Invariants: every helper goes through the real HTTP API of a served dispatcher; helpers that
expect success assert the status code with the response text, so a failing setup step says why.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import httpx

from taskplat.testkit.dispatcher_harness import Dispatcher

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Lease:
    """What a worker holds after a claim: the fence of every later call."""

    task_id: str
    attempt: int
    lease_token: str

    def fence(self) -> JsonDict:
        return {"task_id": self.task_id, "attempt": self.attempt, "lease_token": self.lease_token}


def create_task(dispatcher: Dispatcher, **fields: Any) -> JsonDict:
    """POST /tasks (operator `echo` unless given); asserts 201 and returns the task view."""
    body: JsonDict = {"operator": "echo", **fields}
    response = dispatcher.api.post("/tasks", json=body)
    assert response.status_code == 201, response.text
    task: JsonDict = response.json()
    return task


def get_task(dispatcher: Dispatcher, task_id: str) -> JsonDict:
    response = dispatcher.api.get(f"/tasks/{task_id}")
    assert response.status_code == 200, response.text
    task: JsonDict = response.json()
    return task


def claim(dispatcher: Dispatcher, task_id: str, worker_id: str = "worker-1") -> httpx.Response:
    return dispatcher.worker.post(
        "/internal/task-claim", json={"task_id": task_id, "worker_id": worker_id}
    )


def claimed(dispatcher: Dispatcher, task_id: str, worker_id: str = "worker-1") -> Lease:
    """Claim `task_id`, asserting it was Claimed."""
    response = claim(dispatcher, task_id, worker_id)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "Claimed", body
    return Lease(task_id, body["attempt"], body["lease_token"])


def heartbeat(dispatcher: Dispatcher, lease: Lease) -> httpx.Response:
    return dispatcher.worker.post("/internal/heartbeat", json=lease.fence())


def emit_events(
    dispatcher: Dispatcher, lease: Lease, events: list[JsonDict], *, with_token: bool = True
) -> httpx.Response:
    body: JsonDict = {"task_id": lease.task_id, "attempt": lease.attempt, "events": events}
    if with_token:
        body["lease_token"] = lease.lease_token
    return dispatcher.worker.post("/internal/events", json=body)


def complete(
    dispatcher: Dispatcher, lease: Lease, status: str = "Completed", **fields: Any
) -> httpx.Response:
    return dispatcher.worker.post(
        "/internal/task-complete", json={**lease.fence(), "status": status, **fields}
    )


def cancel(dispatcher: Dispatcher, task_id: str) -> httpx.Response:
    return dispatcher.api.put(f"/tasks/{task_id}/cancel")


def replay(dispatcher: Dispatcher, task_id: str) -> httpx.Response:
    return dispatcher.api.post(f"/tasks/{task_id}/retry")


def cursor_event(cursor: int, dataset: str | None = None, version: str | None = None) -> JsonDict:
    return {
        "dataset_uuid": dataset or str(uuid4()),
        "dataset_version": version or str(uuid4()),
        "cursor": cursor,
    }


def partition_event(start: int, end: int, dataset: str, version: str) -> JsonDict:
    return {
        "dataset_uuid": dataset,
        "dataset_version": version,
        "partition_key": f"{start}-{end}",
        "start": start,
        "end": end,
    }


def output(index: int, **fields: Any) -> JsonDict:
    return {
        "output_index": index,
        "dataset_uuid": str(uuid4()),
        "dataset_version": str(uuid4()),
        "location": f"postgres_table:dataset_{index}",
        "cursor": 100 + index,
        "row_count": 1000 * (index + 1),
        **fields,
    }


def assert_rejected(response: httpx.Response, reason: str, status_code: int = 409) -> None:
    assert response.status_code == status_code, response.text
    body = response.json()
    assert body["status"] == "Rejected", body
    assert body["reason"] == reason, body


# The routes of the HTTP API reference, and the batch routes of the performance work (bulk
# create, batch claim and complete, claim-next), as (method, path template).
PUBLIC_ROUTES = (
    ("POST", "/tasks"),
    ("POST", "/tasks/batch"),
    ("GET", "/tasks"),
    ("GET", "/tasks/{task_id}"),
    ("PUT", "/tasks/{task_id}/cancel"),
    ("POST", "/tasks/{task_id}/retry"),
    ("PUT", "/dags/{dag_name}"),
    ("GET", "/dags"),
    ("GET", "/dags/{dag_name}"),
    ("DELETE", "/dags/{dag_name}"),
    ("POST", "/dags/{dag_name}/jobs/{job}/runs"),
    ("GET", "/datasets"),
    ("GET", "/datasets/{dataset_uuid}"),
    ("POST", "/datasets/{dataset_uuid}/versions"),
    ("POST", "/datasets/{dataset_uuid}/current"),
    ("GET", "/datasets/{dataset_uuid}/events"),
    ("GET", "/tasks/{task_id}/events"),
    ("POST", "/tasks/retry"),
    ("GET", "/queues"),
    ("GET", "/queues/{queue}"),
    ("PUT", "/queues/{queue}/pause"),
    ("PUT", "/queues/{queue}/resume"),
    ("GET", "/stats"),
    ("POST", "/keys"),
    ("GET", "/keys"),
    ("DELETE", "/keys/{name}"),
    ("GET", "/audit"),
    ("GET", "/workers"),
    ("PUT", "/queues/{queue}"),
)
INTERNAL_ROUTES = (
    ("POST", "/internal/task-claim"),
    ("GET", "/internal/task-fetch"),
    ("POST", "/internal/heartbeat"),
    ("POST", "/internal/task-complete"),
    ("POST", "/internal/events"),
    ("POST", "/internal/steps"),
    ("POST", "/internal/task-claim-batch"),
    ("POST", "/internal/task-claim-next"),
    ("POST", "/internal/task-complete-batch"),
)
OPEN_ROUTES = (
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
)


def race(
    dispatcher: Dispatcher, client: httpx.Client, calls: list[tuple[str, str, JsonDict]]
) -> list[httpx.Response]:
    """Send `calls` (method, path, JSON body) at once, one thread and connection each, with the
    headers of `client`; answers in the order of `calls`."""
    barrier = threading.Barrier(len(calls))

    def send(call: tuple[str, str, JsonDict]) -> httpx.Response:
        method, path, body = call
        with httpx.Client(base_url=dispatcher.base_url, headers=client.headers, timeout=30) as own:
            barrier.wait(timeout=30)
            return own.request(method, path, json=body)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(send, calls))
