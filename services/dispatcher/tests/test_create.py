"""`POST /tasks`: new -> Queued (with its outbox row) or Scheduled, defaults, idempotency keys."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

import httpx
import psycopg
import pytest

from taskplat.testkit.dispatcher_calls import create_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import (
    outbox_rows,
    outbox_xmins,
    row_counts,
    task_row,
    task_xmin,
)

# Fields of the task view that the HTTP API reference (docs/reference/http-api.md) lists.
DOCUMENTED_VIEW_FIELDS = {
    "task_id",
    "status",
    "attempt",
    "max_attempts",
    "operator",
    "queue",
    "job",
    "config",
    "inputs",
    "result",
    "last_error",
    "scheduled_for",
    "next_retry_at",
    "expires_at",
    "timeout_seconds",
    "worker_id",
    "created_at",
    "started_at",
    "finished_at",
    "outputs",
    "attempts",
}


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    return {
        "operator_defaults": {
            "slow": {"max_attempts": 7, "backoff_base_seconds": 2.5, "max_processing_attempts": 4}
        },
        "default_backoff_max_seconds": 120.0,
    }


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_create_queued_writes_the_task_and_its_outbox_row_in_one_transaction(
    dispatcher: Dispatcher, db_url: str
) -> None:
    now = dispatcher.clock.now()
    body = {
        "operator": "block_follower",
        "config": {"chain": "monad", "nested": {"a": [1, 2]}},
        "inputs": [{"dataset": "blocks"}, 3],
        "queue": "fast-lane",
        "max_attempts": 5,
        "timeout_seconds": 90,
        "backoff_base_seconds": 0.5,
        "backoff_max_seconds": 30,
        "expires_at": (now + timedelta(hours=1)).isoformat(),
        "idempotency_key": "key-1",
        "job": {"dag_name": "monad", "name": "block_follower"},
    }
    response = dispatcher.api.post("/tasks", json=body)
    assert response.status_code == 201, response.text
    task = response.json()
    assert DOCUMENTED_VIEW_FIELDS <= set(task)
    assert task["status"] == "Queued"
    assert task["attempt"] == 1
    for field in (
        "operator",
        "config",
        "inputs",
        "queue",
        "max_attempts",
        "timeout_seconds",
        "backoff_base_seconds",
        "backoff_max_seconds",
        "idempotency_key",
        "job",
    ):
        assert task[field] == body[field], field
    assert ts(task["expires_at"]) == now + timedelta(hours=1)
    assert ts(task["created_at"]) == now
    for field in (
        "result",
        "last_error",
        "scheduled_for",
        "next_retry_at",
        "worker_id",
        "started_at",
        "finished_at",
    ):
        assert task[field] is None, field
    assert task["outputs"] == [] and task["attempts"] == []

    outbox = outbox_rows(db_url, task["task_id"])
    assert len(outbox) == 1
    row = outbox[0]
    assert row["kind"] == "enqueue_task"
    assert row["queue"] == "fast-lane"
    assert row["payload"] == {"task_id": task["task_id"]}
    assert row["created_at"] == now and row["available_at"] == now
    assert row["sent_at"] is None
    # The same transaction wrote the task row and the outbox row.
    assert outbox_xmins(db_url, task["task_id"]) == [task_xmin(db_url, task["task_id"])]
    stored = task_row(db_url, task["task_id"])
    assert stored is not None and stored["queued_at"] == now


@pytest.mark.parametrize("scheduled", [False, True])
def test_the_create_answer_is_the_task_as_a_read_shows_it(
    dispatcher: Dispatcher, scheduled: bool
) -> None:
    """The create answers from its statement's row, not a read back: every field as GET shows it."""
    body: dict[str, object] = {"operator": "slow", "config": {"a": 1}, "inputs": [1, "x"]}
    if scheduled:
        body["scheduled_for"] = (dispatcher.clock.now() + timedelta(hours=1)).isoformat()
    response = dispatcher.api.post("/tasks", json=body)
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["status"] == ("Scheduled" if scheduled else "Queued")
    assert created == dispatcher.api.get(f"/tasks/{created['task_id']}").json()


def test_create_uses_global_and_per_operator_defaults(dispatcher: Dispatcher) -> None:
    plain = create_task(dispatcher)
    assert plain["queue"] == "default"
    assert plain["config"] == {} and plain["inputs"] == []
    assert plain["max_attempts"] == 3
    assert plain["backoff_base_seconds"] == 1.0
    assert plain["backoff_max_seconds"] == 120.0
    assert plain["job"] is None and plain["timeout_seconds"] is None

    slow = create_task(dispatcher, operator="slow")
    assert slow["max_attempts"] == 7
    assert slow["backoff_base_seconds"] == 2.5
    assert slow["backoff_max_seconds"] == 120.0

    # A value set on the task wins over the operator's default.
    assert create_task(dispatcher, operator="slow", max_attempts=2)["max_attempts"] == 2

    # Both budgets, and both counters, show in the view.
    assert (plain["max_processing_attempts"], slow["max_processing_attempts"]) == (10, 4)
    assert (plain["counted_attempts"], plain["processing_attempts"]) == (1, 0)
    assert create_task(dispatcher, max_processing_attempts=2)["max_processing_attempts"] == 2
    batch = dispatcher.api.post(
        "/tasks/batch",
        json={"tasks": [{"operator": "slow"}, {"operator": "x", "max_processing_attempts": 3}]},
    )
    assert batch.status_code in (200, 201), batch.text
    views = [item["task"] for item in batch.json()["results"]]
    assert [view["max_processing_attempts"] for view in views] == [4, 3]


def test_create_scheduled_in_the_future_of_the_clock_writes_no_outbox_row(
    dispatcher: Dispatcher, db_url: str
) -> None:
    now = dispatcher.clock.now()
    later = now + timedelta(minutes=5)
    scheduled = create_task(dispatcher, scheduled_for=later.isoformat())
    assert scheduled["status"] == "Scheduled"
    assert ts(scheduled["scheduled_for"]) == later
    assert outbox_rows(db_url, scheduled["task_id"]) == []
    stored = task_row(db_url, scheduled["task_id"])
    assert stored is not None and stored["queued_at"] is None

    # Another time zone offset names the same instant.
    offset = later.astimezone(timezone(timedelta(hours=2)))
    assert create_task(dispatcher, scheduled_for=offset.isoformat())["status"] == "Scheduled"

    # Due now, or in the past of the fake clock (though in the future of the wall clock): Queued.
    for due in (now, now - timedelta(seconds=1), datetime.now(UTC) + timedelta(days=1)):
        assert due <= now
        task = create_task(dispatcher, scheduled_for=due.isoformat())
        assert task["status"] == "Queued", due
        assert [row["kind"] for row in outbox_rows(db_url, task["task_id"])] == ["enqueue_task"]


def test_same_idempotency_key_answers_200_with_the_existing_task_and_creates_nothing(
    dispatcher: Dispatcher, db_url: str
) -> None:
    first = dispatcher.api.post("/tasks", json={"operator": "echo", "idempotency_key": "abc"})
    assert first.status_code == 201, first.text
    counts = row_counts(db_url)

    dispatcher.clock.advance(60)
    again = dispatcher.api.post("/tasks", json={"operator": "echo", "idempotency_key": "abc"})
    assert again.status_code == 200, again.text
    assert again.json() == first.json()

    # Even a different body with the same key names the existing task.
    other = dispatcher.api.post(
        "/tasks", json={"operator": "other", "queue": "q2", "idempotency_key": "abc"}
    )
    assert other.status_code == 200, other.text
    assert other.json()["task_id"] == first.json()["task_id"]
    assert other.json()["operator"] == "echo"
    assert row_counts(db_url) == counts

    # Another key creates another task.
    fresh = dispatcher.api.post("/tasks", json={"operator": "echo", "idempotency_key": "abd"})
    assert fresh.status_code == 201
    assert fresh.json()["task_id"] != first.json()["task_id"]


def test_task_ids_are_time_ordered_uuid7(dispatcher: Dispatcher) -> None:
    """New tasks' ids are UUIDv7, so the primary key grows at its right edge (single and bulk)."""
    single = [create_task(dispatcher)["task_id"] for _ in range(3)]
    batch = dispatcher.api.post(
        "/tasks/batch", json={"tasks": [{"operator": "echo"} for _ in range(3)]}
    )
    assert batch.status_code in (200, 201), batch.text
    ids = [UUID(task_id) for task_id in single] + [
        UUID(item["task"]["task_id"]) for item in batch.json()["results"]
    ]
    assert {task_id.version for task_id in ids} == {7}
    millis = [task_id.int >> 80 for task_id in ids]
    assert millis == sorted(millis), "a later task's id has an earlier timestamp"


def test_concurrent_creates_with_one_key_give_one_task(dispatcher: Dispatcher, db_url: str) -> None:
    threads, rounds = 16, 5
    local = threading.local()

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = httpx.Client(
                base_url=dispatcher.base_url, headers=dispatcher.api.headers, timeout=30
            )
        result: httpx.Client = local.client
        return result

    clients: list[httpx.Client] = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for round_ in range(rounds):
            barrier = threading.Barrier(threads)
            key = f"concurrent-{round_}"

            def create(
                _: int, key: str = key, barrier: threading.Barrier = barrier
            ) -> tuple[int, str]:
                own = client()
                if own not in clients:
                    clients.append(own)
                barrier.wait(timeout=30)
                response = own.post("/tasks", json={"operator": "echo", "idempotency_key": key})
                return response.status_code, response.json()["task_id"]

            results = list(pool.map(create, range(threads)))
            statuses = sorted(status for status, _ in results)
            assert statuses == [200] * (threads - 1) + [201], results
            assert len({task_id for _, task_id in results}) == 1
    for each in clients:
        each.close()
    counts = row_counts(db_url)
    assert counts["tasks"] == rounds
    assert counts["outbox"] == rounds


def test_a_queued_create_notifies_the_relay_once_and_nothing_else_does(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """The task, its wake-up and the relay's NOTIFY are one statement: a Queued task notifies
    its queue once; a Scheduled one and a repeated idempotency key notify nothing."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN taskplat_outbox")
        later = (dispatcher.clock.now() + timedelta(minutes=5)).isoformat()
        create_task(dispatcher, scheduled_for=later)
        first = dispatcher.api.post("/tasks", json={"operator": "echo", "idempotency_key": "n-1"})
        assert first.status_code == 201, first.text
        again = dispatcher.api.post("/tasks", json={"operator": "echo", "idempotency_key": "n-1"})
        assert again.status_code == 200, again.text
        create_task(dispatcher, queue="fast-lane")
        # The last create's notification comes after the others': wait for it, then read all.
        received: list[str] = []
        for notify in listener.notifies(timeout=10):
            received.append(notify.payload)
            if notify.payload == "fast-lane":
                break
    assert received == ["default", "fast-lane"]
