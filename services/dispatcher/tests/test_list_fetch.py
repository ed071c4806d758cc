"""`GET /tasks` (filters, cursor pagination), `GET /tasks/{id}` and `/internal/task-fetch`."""

from __future__ import annotations

import itertools
from typing import Any
from uuid import UUID, uuid4

from taskplat.common.contracts import FetchResponse, TaskList, TaskView
from taskplat.testkit.dispatcher_calls import cancel, claimed, create_task, get_task
from taskplat.testkit.dispatcher_harness import Dispatcher


def _walk(dispatcher: Dispatcher, limit: int, **filters: str) -> list[dict[str, Any]]:
    """Every page of a listing, following `next_cursor` to the end."""
    tasks: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(1000):
        params: dict[str, Any] = {"limit": limit, **filters}
        if cursor is not None:
            params["cursor"] = cursor
        response = dispatcher.api.get("/tasks", params=params)
        assert response.status_code == 200, response.text
        page = TaskList.model_validate_json(response.text)
        assert len(page.tasks) <= limit
        body = response.json()
        tasks.extend(body["tasks"])
        cursor = body["next_cursor"]
        if cursor is None:
            return tasks
        assert len(page.tasks) == limit
    raise AssertionError("pagination does not end")


def _order_key(task: dict[str, Any]) -> tuple[str, UUID]:
    return task["created_at"], UUID(task["task_id"])


def test_list_filters_and_paginates_without_duplicates_or_gaps(dispatcher: Dispatcher) -> None:
    created: list[dict[str, Any]] = []
    combos = itertools.product(("alpha", "beta"), ("op_x", "op_y"))
    for index, (queue, operator) in enumerate(itertools.islice(itertools.cycle(combos), 23)):
        # Several tasks share a creation instant: pagination must break ties by task_id.
        if index % 4 == 0:
            dispatcher.clock.advance(1)
        created.append(create_task(dispatcher, queue=queue, operator=operator))
    for task in created[::5]:
        assert cancel(dispatcher, task["task_id"]).status_code == 200
        task["status"] = "Canceled"
    running = claimed(dispatcher, created[1]["task_id"])
    created[1]["status"] = "Running"

    expected_order = sorted(created, key=_order_key, reverse=True)
    for limit in (1, 4, 5, 23, 50):
        listed = _walk(dispatcher, limit)
        ids = [task["task_id"] for task in listed]
        assert len(ids) == len(set(ids)), "a task appeared twice"
        assert ids == [task["task_id"] for task in expected_order], limit

    filter_cases: list[dict[str, str]] = [
        {"status": "Canceled"},
        {"status": "Queued"},
        {"status": "Running"},
        {"status": "Completed"},
        {"queue": "alpha"},
        {"operator": "op_y"},
        {"queue": "beta", "operator": "op_x"},
        {"queue": "beta", "status": "Queued", "operator": "op_y"},
        {"queue": "nowhere"},
    ]
    for filters in filter_cases:
        expected = [
            task["task_id"]
            for task in expected_order
            if all(task[key] == value for key, value in filters.items())
        ]
        listed = _walk(dispatcher, 2, **filters)
        assert [task["task_id"] for task in listed] == expected, filters
        for task in listed:
            TaskView.model_validate(task)
    assert _walk(dispatcher, 10, status="Running")[0]["worker_id"] == "worker-1"
    assert running.attempt == 1


def test_pages_do_not_shift_when_tasks_are_created_while_paginating(
    dispatcher: Dispatcher,
) -> None:
    first = [create_task(dispatcher)["task_id"] for _ in range(6)]
    page = dispatcher.api.get("/tasks", params={"limit": 3}).json()
    dispatcher.clock.advance(1)
    create_task(dispatcher)  # newer than every listed task: never on a later page
    rest = _walk_from(dispatcher, page["next_cursor"], 3)
    seen = [task["task_id"] for task in page["tasks"]] + rest
    assert sorted(seen) == sorted(first)


def _walk_from(dispatcher: Dispatcher, cursor: str | None, limit: int) -> list[str]:
    ids: list[str] = []
    while cursor is not None:
        body = dispatcher.api.get("/tasks", params={"limit": limit, "cursor": cursor}).json()
        ids.extend(task["task_id"] for task in body["tasks"])
        cursor = body["next_cursor"]
    return ids


def test_list_of_nothing_is_one_empty_page(dispatcher: Dispatcher) -> None:
    response = dispatcher.api.get("/tasks")
    assert response.status_code == 200
    assert response.json() == {"tasks": [], "next_cursor": None}


def test_get_task_and_task_fetch(dispatcher: Dispatcher) -> None:
    job = {"dag_name": "d", "name": "n"}
    task = create_task(dispatcher, config={"k": "v"}, inputs=[1], job=job, timeout_seconds=30)
    view = get_task(dispatcher, task["task_id"])
    assert view == task
    TaskView.model_validate(view)

    fetched = dispatcher.worker.get("/internal/task-fetch", params={"task_id": task["task_id"]})
    assert fetched.status_code == 200, fetched.text
    FetchResponse.model_validate_json(fetched.text)
    body = fetched.json()
    assert body["status"] == "Queued"
    assert body["task"]["task_id"] == task["task_id"]
    assert (body["task"]["config"], body["task"]["inputs"], body["task"]["job"]) == (
        {"k": "v"},
        [1],
        job,
    )
    assert body["task"]["deadline_at"] is None

    lease = claimed(dispatcher, task["task_id"])
    running = dispatcher.worker.get("/internal/task-fetch", params={"task_id": lease.task_id})
    assert running.json()["status"] == "Running"
    assert running.json()["task"]["deadline_at"] is not None
    assert cancel(dispatcher, lease.task_id).status_code == 200
    canceled = dispatcher.worker.get("/internal/task-fetch", params={"task_id": lease.task_id})
    assert canceled.json()["status"] == "Canceled"

    unknown = str(uuid4())
    missing = dispatcher.api.get(f"/tasks/{unknown}")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    missing_fetch = dispatcher.worker.get("/internal/task-fetch", params={"task_id": unknown})
    assert missing_fetch.status_code == 404


def test_list_finds_a_task_by_idempotency_key_and_filters_by_creation_time(
    dispatcher: Dispatcher,
) -> None:
    first = create_task(dispatcher, idempotency_key="order-17")
    start = dispatcher.clock.advance(60)
    second = create_task(dispatcher)
    found = dispatcher.api.get("/tasks", params={"idempotency_key": "order-17"}).json()
    assert [t["task_id"] for t in found["tasks"]] == [first["task_id"]]
    none = dispatcher.api.get("/tasks", params={"idempotency_key": "nope"}).json()
    assert none == {"tasks": [], "next_cursor": None}
    since = dispatcher.api.get("/tasks", params={"since": start.isoformat()}).json()
    assert [t["task_id"] for t in since["tasks"]] == [second["task_id"]]
    until = dispatcher.api.get("/tasks", params={"until": start.isoformat()}).json()
    assert [t["task_id"] for t in until["tasks"]] == [first["task_id"]]
    naive = dispatcher.api.get("/tasks", params={"since": "2026-01-01T00:00:00"})
    assert naive.status_code == 422
