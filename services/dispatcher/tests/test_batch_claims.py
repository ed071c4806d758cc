"""`/internal/task-claim-batch` and `/internal/task-claim-next`: one statement claims several
tasks, each answer means what the single claim's would, and concurrent batch claims never claim
one task twice nor deadlock."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import httpx
import psycopg
import pytest

from taskplat.common.contracts import ClaimBatchResponse, ClaimNextResponse
from taskplat.testkit.dispatcher_calls import cancel, claimed, complete, create_task
from taskplat.testkit.dispatcher_harness import TEST_QUEUES, Dispatcher
from taskplat.testkit.dispatcher_rows import attempt_rows, row_counts, task_row

JsonDict = dict[str, Any]

RACE_REPETITIONS = 12


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    """The race test's own queues (race0, race1, ...) are registered too."""
    return {"queues": ",".join([TEST_QUEUES, *(f"race{n}" for n in range(RACE_REPETITIONS))])}


def claim_batch(dispatcher: Dispatcher, task_ids: list[str], worker_id: str = "w-1") -> JsonDict:
    """The batch claim's answer, and under "results" the answer of each task_id in order."""
    response = dispatcher.worker.post(
        "/internal/task-claim-batch", json={"worker_id": worker_id, "task_ids": task_ids}
    )
    assert response.status_code == 200, response.text
    ClaimBatchResponse.model_validate_json(response.text)
    body: JsonDict = response.json()
    claimed = list(body["claimed"])
    not_claimed = list(body["not_claimed"])
    results = []
    for task_id in task_ids:
        if claimed and claimed[0]["task"]["task_id"] == task_id:
            results.append(claimed.pop(0))
        else:
            item = not_claimed.pop(0)
            assert item["task_id"] == task_id, (task_id, body)
            results.append({"status": "NotClaimed", "reason": item["reason"]})
    assert claimed == [] and not_claimed == []
    return {**body, "results": results}


def claim_next(dispatcher: Dispatcher, queue: str, limit: int, worker_id: str = "w-1") -> JsonDict:
    response = dispatcher.worker.post(
        "/internal/task-claim-next", json={"worker_id": worker_id, "queue": queue, "max": limit}
    )
    assert response.status_code == 200, response.text
    ClaimNextResponse.model_validate_json(response.text)
    body: JsonDict = response.json()
    return body


def test_a_batch_claims_every_queued_task_and_says_why_not_for_the_others(
    dispatcher: Dispatcher, db_url: str
) -> None:
    queued = [create_task(dispatcher, queue="q")["task_id"] for _ in range(3)]
    running = create_task(dispatcher)["task_id"]
    claimed(dispatcher, running, "other")
    done = create_task(dispatcher)["task_id"]
    assert complete(dispatcher, claimed(dispatcher, done)).status_code == 200
    canceled = create_task(dispatcher)["task_id"]
    assert cancel(dispatcher, canceled).status_code == 200
    later = (dispatcher.clock.now() + timedelta(hours=1)).isoformat()
    scheduled = create_task(dispatcher, scheduled_for=later)["task_id"]
    ghost = str(uuid4())
    dispatcher.clock.advance(3)
    now = dispatcher.clock.now()

    asked = [queued[0], running, done, canceled, scheduled, ghost, queued[1], queued[2]]
    results = claim_batch(dispatcher, asked, "w-batch")["results"]

    assert [result["status"] for result in results] == [
        "Claimed", "NotClaimed", "NotClaimed", "NotClaimed", "NotClaimed", "NotClaimed",
        "Claimed", "Claimed",
    ]  # fmt: skip
    assert [result.get("reason") for result in results[1:6]] == [
        "AlreadyRunning", "Completed", "Canceled", "NotQueued", "NotFound",
    ]  # fmt: skip
    tokens = set()
    for task_id, result in zip(asked, results, strict=True):
        if result["status"] != "Claimed":
            continue
        assert result["task"]["task_id"] == task_id
        assert result["task"]["queue"] == "q"
        assert result["attempt"] == 1
        expires = datetime.fromisoformat(result["lease_expires_at"])
        assert expires == now + timedelta(seconds=dispatcher.settings.lease_ttl_seconds)
        row = task_row(db_url, task_id)
        assert row is not None
        assert row["status"] == "Running" and row["worker_id"] == "w-batch"
        assert str(row["lease_token"]) == result["lease_token"]
        (attempt,) = attempt_rows(db_url, task_id)
        assert str(attempt["lease_token"]) == result["lease_token"]
        assert attempt["worker_id"] == "w-batch" and attempt["started_at"] == now
        tokens.add(result["lease_token"])
    assert len(tokens) == 3  # each claim has its own lease
    # The tasks that were not claimed are as they were.
    assert task_row(db_url, running)["worker_id"] == "other"
    assert task_row(db_url, scheduled)["status"] == "Scheduled"


def test_a_task_named_twice_in_one_batch_is_claimed_once(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task_id = create_task(dispatcher)["task_id"]
    results = claim_batch(dispatcher, [task_id, task_id, task_id])["results"]
    assert results[0]["status"] == "Claimed"
    assert results[1:] == [{"status": "NotClaimed", "reason": "AlreadyRunning"}] * 2
    assert len(attempt_rows(db_url, task_id)) == 1


def test_an_expired_queued_task_is_not_claimed_by_a_batch(
    dispatcher: Dispatcher, db_url: str
) -> None:
    expires_at = dispatcher.clock.now() + timedelta(seconds=30)
    expiring = create_task(dispatcher, expires_at=expires_at.isoformat())["task_id"]
    fresh = create_task(dispatcher)["task_id"]
    dispatcher.clock.advance(31)
    results = claim_batch(dispatcher, [expiring, fresh])["results"]
    assert results[0] == {"status": "NotClaimed", "reason": "NotQueued"}
    assert results[1]["status"] == "Claimed"
    assert task_row(db_url, expiring)["status"] == "Queued"
    # claim-next does not take it either.
    assert claim_next(dispatcher, "default", 10)["claimed"] == []


def test_batch_bounds_are_enforced(dispatcher: Dispatcher) -> None:
    ids = [str(uuid4()) for _ in range(11)]
    for body in (
        {"worker_id": "w", "task_ids": ids},
        {"worker_id": "w", "task_ids": []},
    ):
        response = dispatcher.worker.post("/internal/task-claim-batch", json=body)
        assert response.status_code == 422, response.text
    for limit in (0, 11):
        response = dispatcher.worker.post(
            "/internal/task-claim-next", json={"worker_id": "w", "queue": "q", "max": limit}
        )
        assert response.status_code == 422, response.text


def test_claim_next_takes_only_queued_tasks_of_its_queue_oldest_first_and_at_most_max(
    dispatcher: Dispatcher, db_url: str
) -> None:
    mine = []
    for _ in range(5):
        mine.append(create_task(dispatcher, queue="mine")["task_id"])
        dispatcher.clock.advance(1)
    other = create_task(dispatcher, queue="other")["task_id"]
    running = create_task(dispatcher, queue="mine")["task_id"]
    claimed(dispatcher, running)
    later = (dispatcher.clock.now() + timedelta(hours=1)).isoformat()
    scheduled = create_task(dispatcher, queue="mine", scheduled_for=later)["task_id"]
    canceled = create_task(dispatcher, queue="mine")["task_id"]
    assert cancel(dispatcher, canceled).status_code == 200

    first = claim_next(dispatcher, "mine", 2, "w-next")["claimed"]
    assert [each["task"]["task_id"] for each in first] == mine[:2]
    second = claim_next(dispatcher, "mine", 10, "w-next")["claimed"]
    assert [each["task"]["task_id"] for each in second] == mine[2:]
    assert claim_next(dispatcher, "mine", 10)["claimed"] == []
    for each in first + second:
        assert each["status"] == "Claimed" and each["attempt"] == 1
        row = task_row(db_url, each["task"]["task_id"])
        assert row is not None and row["status"] == "Running" and row["worker_id"] == "w-next"
        (attempt,) = attempt_rows(db_url, each["task"]["task_id"])
        assert str(attempt["lease_token"]) == each["lease_token"]
    assert task_row(db_url, other)["status"] == "Queued"
    assert task_row(db_url, scheduled)["status"] == "Scheduled"
    assert task_row(db_url, canceled)["status"] == "Canceled"
    assert len(attempt_rows(db_url, running)) == 1


def _own_client(dispatcher: Dispatcher) -> httpx.Client:
    return httpx.Client(base_url=dispatcher.base_url, headers=dispatcher.worker.headers, timeout=60)


def test_concurrent_claim_next_never_claims_a_task_twice(
    dispatcher: Dispatcher, db_url: str
) -> None:
    threads, repetitions, tasks = 6, 8, 25
    local = threading.local()
    clients: list[httpx.Client] = []
    lock = threading.Lock()

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = _own_client(dispatcher)
            with lock:
                clients.append(local.client)
        own: httpx.Client = local.client
        return own

    total = 0
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for repetition in range(repetitions):
                queue = f"race{repetition}"
                response = dispatcher.api.post(
                    "/tasks/batch", json={"tasks": [{"operator": "echo", "queue": queue}] * tasks}
                )
                assert response.status_code == 201, response.text
                barrier = threading.Barrier(threads)

                def drain(
                    worker: int, queue: str = queue, barrier: threading.Barrier = barrier
                ) -> list[str]:
                    own = client()
                    barrier.wait(timeout=30)
                    got: list[str] = []
                    while True:
                        response = own.post(
                            "/internal/task-claim-next",
                            json={"worker_id": f"w{worker}", "queue": queue, "max": 3},
                        )
                        assert response.status_code == 200, response.text
                        claimed_now = response.json()["claimed"]
                        assert len(claimed_now) <= 3
                        got += [each["task"]["task_id"] for each in claimed_now]
                        if not claimed_now:
                            return got

                claimed_ids = [
                    task_id for got in pool.map(drain, range(threads)) for task_id in got
                ]
                counts = Counter(claimed_ids)
                assert len(counts) == tasks, "every task claimed"
                assert max(counts.values()) == 1, "no task claimed twice"
                total += tasks
    finally:
        for each in clients:
            each.close()
    assert row_counts(db_url)["task_attempts"] == total


def test_concurrent_overlapping_batch_claims_claim_each_task_once_without_deadlock(
    dispatcher: Dispatcher, db_url: str
) -> None:
    threads, repetitions = 5, RACE_REPETITIONS
    clients = [_own_client(dispatcher) for _ in range(threads)]
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for _ in range(repetitions):
                ids = [create_task(dispatcher)["task_id"] for _ in range(10)]
                barrier = threading.Barrier(threads)

                def race(
                    worker: int, ids: list[str] = ids, barrier: threading.Barrier = barrier
                ) -> list[JsonDict]:
                    # Each worker names the same tasks in a different order.
                    order = ids[worker:] + ids[:worker]
                    if worker % 2:
                        order.reverse()
                    barrier.wait(timeout=30)
                    response = clients[worker].post(
                        "/internal/task-claim-batch",
                        json={"worker_id": f"w{worker}", "task_ids": order},
                    )
                    assert response.status_code == 200, response.text
                    body = response.json()
                    won: list[JsonDict] = body["claimed"]
                    lost = [item["task_id"] for item in body["not_claimed"]]
                    assert {item["reason"] for item in body["not_claimed"]} <= {"AlreadyRunning"}
                    # Every task named is answered, in the order named.
                    named = [each["task"]["task_id"] for each in won] + lost
                    assert sorted(named) == sorted(order)
                    assert [t for t in order if t in lost] == lost
                    return won

                won = [r["task"]["task_id"] for got in pool.map(race, range(threads)) for r in got]
                assert sorted(won) == sorted(ids)
                for task_id in ids:
                    assert len(attempt_rows(db_url, task_id)) == 1
    finally:
        for each in clients:
            each.close()


def _claimed_ahead_at(db_url: str, queue: str) -> datetime | None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT claimed_ahead_at FROM queues WHERE name = %s", (queue,)
        ).fetchone()
    assert row is not None, queue
    stamp: datetime | None = row[0]
    return stamp


def test_a_full_claim_next_stamps_its_queue_claimed_ahead(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """The relay holds back wake-ups deep in a backlog only while its workers claim ahead: a
    claim-next that came back full (two or more, as many as asked) says so; a partial one, or one
    of a single task, does not."""
    for _ in range(3):
        create_task(dispatcher, queue="mine")
        create_task(dispatcher, queue="other")
    assert _claimed_ahead_at(db_url, "mine") is None

    assert len(claim_next(dispatcher, "mine", 1)["claimed"]) == 1  # one task: no backlog shown
    assert _claimed_ahead_at(db_url, "mine") is None
    assert len(claim_next(dispatcher, "other", 10)["claimed"]) == 3  # not full
    assert _claimed_ahead_at(db_url, "other") is None
    assert len(claim_next(dispatcher, "mine", 2)["claimed"]) == 2  # full
    assert _claimed_ahead_at(db_url, "mine") == dispatcher.clock.now()
