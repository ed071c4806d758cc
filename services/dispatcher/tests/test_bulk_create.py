"""`POST /tasks/batch`: many tasks in one transaction, each as `POST /tasks` would create it,
idempotency keys honoured per item, one outbox row per Queued task, nothing written when any
item is invalid."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from taskplat.common.contracts import CreateTasksResponse
from taskplat.testkit.dispatcher_calls import claimed, create_task, get_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import outbox_rows, row_counts, task_row

JsonDict = dict[str, Any]


def create_many(dispatcher: Dispatcher, tasks: list[JsonDict]) -> list[JsonDict]:
    response = dispatcher.api.post("/tasks/batch", json={"tasks": tasks})
    assert response.status_code == 201, response.text
    CreateTasksResponse.model_validate_json(response.text)
    results: list[JsonDict] = response.json()["results"]
    assert len(results) == len(tasks)
    return results


def test_bulk_create_makes_each_task_as_post_tasks_would(
    dispatcher: Dispatcher, db_url: str
) -> None:
    later = (dispatcher.clock.now() + timedelta(hours=1)).isoformat()
    job = {"dag_name": "d", "name": "n"}
    results = create_many(
        dispatcher,
        [
            {"operator": "echo", "config": {"n": 1}, "inputs": [1], "queue": "a", "job": job},
            {"operator": "echo", "scheduled_for": later, "max_attempts": 7},
            {"operator": "sleep", "timeout_seconds": 30, "backoff_base_seconds": 2},
        ],
    )
    assert [r["created"] for r in results] == [True, True, True]
    first, scheduled, third = (r["task"] for r in results)
    assert first["status"] == "Queued" and first["queue"] == "a" and first["job"] == job
    assert first["config"] == {"n": 1} and first["inputs"] == [1]
    assert scheduled["status"] == "Scheduled" and scheduled["max_attempts"] == 7
    assert third["timeout_seconds"] == 30 and third["backoff_base_seconds"] == 2
    assert third["max_attempts"] == dispatcher.settings.default_max_attempts
    for view in (first, scheduled, third):
        assert get_task(dispatcher, view["task_id"]) == view
    # A wake-up for each Queued task, none for the scheduled one.
    assert [r["kind"] for r in outbox_rows(db_url, first["task_id"])] == ["enqueue_task"]
    assert [r["kind"] for r in outbox_rows(db_url, third["task_id"])] == ["enqueue_task"]
    assert outbox_rows(db_url, scheduled["task_id"]) == []
    assert task_row(db_url, first["task_id"])["queued_at"] is not None


def test_idempotency_keys_are_honoured_per_item(dispatcher: Dispatcher, db_url: str) -> None:
    existing = create_task(dispatcher, idempotency_key="known")
    results = create_many(
        dispatcher,
        [
            {"operator": "echo", "idempotency_key": "known"},
            {"operator": "echo", "idempotency_key": "new"},
            {"operator": "echo", "idempotency_key": "new"},
            {"operator": "echo"},
        ],
    )
    assert [r["created"] for r in results] == [False, True, False, True]
    assert results[0]["task"]["task_id"] == existing["task_id"]
    assert results[1]["task"]["task_id"] == results[2]["task"]["task_id"]
    assert row_counts(db_url)["tasks"] == 3
    again = create_many(dispatcher, [{"operator": "echo", "idempotency_key": "new"}])
    assert again[0] == {"created": False, "task": results[1]["task"]}
    assert row_counts(db_url)["outbox"] == 3  # one wake-up per task created


def test_the_answer_is_each_task_as_a_read_after_the_commit_shows_it(
    dispatcher: Dispatcher,
) -> None:
    """A task the call created is answered from its insert (no attempts, no outputs yet); a task
    whose key was taken is answered as it is now, its attempts included: each equal to the
    GET that follows."""
    existing = create_task(dispatcher, idempotency_key="taken", config={"was": "first"})
    claimed(dispatcher, existing["task_id"], worker_id="worker-9")
    results = create_many(
        dispatcher,
        [
            {"operator": "echo", "idempotency_key": "taken", "config": {"was": "second"}},
            {"operator": "echo", "idempotency_key": "fresh", "max_processing_attempts": 3},
            {"operator": "echo", "idempotency_key": "fresh"},
        ],
    )
    assert [r["created"] for r in results] == [False, True, False]
    taken, fresh, repeat = (r["task"] for r in results)
    assert taken == get_task(dispatcher, existing["task_id"])
    assert taken["status"] == "Running" and taken["config"] == {"was": "first"}
    assert [a["worker_id"] for a in taken["attempts"]] == ["worker-9"]
    assert fresh == repeat == get_task(dispatcher, fresh["task_id"])
    assert fresh["attempts"] == [] and fresh["outputs"] == []
    assert fresh["counted_attempts"] == 1 and fresh["processing_attempts"] == 0
    assert fresh["max_processing_attempts"] == 3 and fresh["idempotency_key"] == "fresh"


def test_an_invalid_item_writes_nothing_and_is_named(dispatcher: Dispatcher, db_url: str) -> None:
    before = row_counts(db_url)
    now = dispatcher.clock.now()
    bad_times = {
        "operator": "echo",
        "scheduled_for": (now + timedelta(hours=2)).isoformat(),
        "expires_at": (now + timedelta(hours=1)).isoformat(),
    }
    response = dispatcher.api.post(
        "/tasks/batch", json={"tasks": [{"operator": "echo"}, bad_times]}
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "tasks", 1, "expires_at"]
    response = dispatcher.api.post(
        "/tasks/batch", json={"tasks": [{"operator": "echo"}, {"operator": ""}]}
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:4] == ["body", "tasks", 1, "operator"]
    for tasks in ([], [{"operator": "echo"}] * 501):
        response = dispatcher.api.post("/tasks/batch", json={"tasks": tasks})
        assert response.status_code == 422, response.text
    assert row_counts(db_url) == before


def test_five_hundred_tasks_in_one_call(dispatcher: Dispatcher, db_url: str) -> None:
    results = create_many(
        dispatcher, [{"operator": "echo", "config": {"i": i}} for i in range(500)]
    )
    assert [r["task"]["config"]["i"] for r in results] == list(range(500))
    assert len({r["task"]["task_id"] for r in results}) == 500
    counts = row_counts(db_url)
    assert counts["tasks"] == 500 and counts["outbox"] == 500
