"""`/internal/task-claim`: Queued -> Running, the Claimed payload of docs/contracts.md, every
NotClaimed reason, and exactly one winner among truly concurrent claims."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from uuid import uuid4

import httpx

from taskplat.common.contracts import ClaimedResponse, NotClaimedResponse
from taskplat.testkit.dispatcher_calls import (
    cancel,
    claim,
    claimed,
    complete,
    create_task,
    get_task,
)
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import (
    attempt_rows,
    reap_timeout,
    row_counts,
    task_row,
    task_state,
)

# The Claimed response of docs/contracts.md and its task payload.
SEED_CLAIMED_FIELDS = {"status", "attempt", "lease_token", "lease_expires_at", "task"}
# docs/contracts.md: every claim also carries its attempt token (and, untrusted, a
# capability token).
TOKEN_FIELDS = {"attempt_token", "capability_token"}
# The create's trace context, for an attempt claimed without its wake-up (migration 0016).
TRACE_FIELDS = {"trace_context"}
SEED_TASK_FIELDS = {"task_id", "attempt", "job", "operator", "config", "inputs"}


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_claim_answers_the_seed_004_payload_and_starts_the_attempt(
    dispatcher: Dispatcher, db_url: str
) -> None:
    job = {"dag_name": "monad", "name": "block_follower"}
    task = create_task(
        dispatcher,
        operator="block_follower",
        config={"chain": "monad"},
        inputs=[{"from": "blocks"}],
        job=job,
        queue="ingest",
        timeout_seconds=600,
    )
    dispatcher.clock.advance(7)
    now = dispatcher.clock.now()
    response = claim(dispatcher, task["task_id"], "ecs:cluster/service/task")
    assert response.status_code == 200, response.text
    body = response.json()
    ClaimedResponse.model_validate_json(response.text)
    assert set(body) == SEED_CLAIMED_FIELDS | TOKEN_FIELDS | TRACE_FIELDS
    assert SEED_TASK_FIELDS <= set(body["task"])
    assert body["status"] == "Claimed"
    assert body["attempt"] == 1 and body["task"]["attempt"] == 1
    assert ts(body["lease_expires_at"]) == now + timedelta(
        seconds=dispatcher.settings.lease_ttl_seconds
    )
    assert body["task"] == {
        "task_id": task["task_id"],
        "attempt": 1,
        "job": job,
        "operator": "block_follower",
        "queue": "ingest",
        "config": {"chain": "monad"},
        "inputs": [{"from": "blocks"}],
        "timeout_seconds": 600,
        "deadline_at": body["task"]["deadline_at"],
        "outputs": [],
        "trust": "trusted",
        "steps": {},
    }
    assert ts(body["task"]["deadline_at"]) == now + timedelta(seconds=600)

    row = task_row(db_url, task["task_id"])
    assert row is not None
    assert row["status"] == "Running"
    assert str(row["lease_token"]) == body["lease_token"]
    assert row["lease_expires_at"] == ts(body["lease_expires_at"])
    assert row["worker_id"] == "ecs:cluster/service/task"
    assert row["started_at"] == now
    (attempt,) = attempt_rows(db_url, task["task_id"])
    assert attempt["attempt"] == 1 and attempt["outcome"] is None
    assert str(attempt["lease_token"]) == body["lease_token"]

    view = get_task(dispatcher, task["task_id"])
    assert view["status"] == "Running"
    assert view["worker_id"] == "ecs:cluster/service/task"
    assert view["attempts"] == [
        {
            "attempt": 1,
            "worker_id": "ecs:cluster/service/task",
            "started_at": view["started_at"],
            "finished_at": None,
            "outcome": None,
            "error": None,
        }
    ]
    assert ts(view["started_at"]) == now


def test_claim_without_a_task_timeout_uses_the_default_deadline(dispatcher: Dispatcher) -> None:
    task = create_task(dispatcher)
    body = claim(dispatcher, task["task_id"]).json()
    assert body["task"]["timeout_seconds"] is None
    assert ts(body["task"]["deadline_at"]) == dispatcher.clock.now() + timedelta(
        seconds=dispatcher.settings.default_timeout_seconds
    )


def _not_claimed(dispatcher: Dispatcher, db_url: str, task_id: str, reason: str) -> None:
    before = task_state(db_url, task_id)
    response = claim(dispatcher, task_id, "late-worker")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "NotClaimed", "reason": reason}
    NotClaimedResponse.model_validate_json(response.text)
    assert task_state(db_url, task_id) == before


def test_not_claimed_reasons_change_nothing(dispatcher: Dispatcher, db_url: str) -> None:
    running = create_task(dispatcher)["task_id"]
    claimed(dispatcher, running)
    _not_claimed(dispatcher, db_url, running, "AlreadyRunning")

    completed = create_task(dispatcher)["task_id"]
    assert complete(dispatcher, claimed(dispatcher, completed)).status_code == 200
    _not_claimed(dispatcher, db_url, completed, "Completed")

    canceled = create_task(dispatcher)["task_id"]
    assert cancel(dispatcher, canceled).status_code == 200
    _not_claimed(dispatcher, db_url, canceled, "Canceled")

    counts = row_counts(db_url)
    _not_claimed(dispatcher, db_url, str(uuid4()), "NotFound")
    assert row_counts(db_url) == counts

    later = (dispatcher.clock.now() + timedelta(hours=1)).isoformat()
    scheduled = create_task(dispatcher, scheduled_for=later)["task_id"]
    _not_claimed(dispatcher, db_url, scheduled, "NotQueued")

    failed = create_task(dispatcher, max_attempts=2)["task_id"]
    lease = claimed(dispatcher, failed)
    assert (
        complete(dispatcher, lease, "Failed", error_message="x").json()["task_status"] == "Failed"
    )
    _not_claimed(dispatcher, db_url, failed, "NotQueued")

    dead = create_task(dispatcher, max_processing_attempts=1)["task_id"]
    lease = claimed(dispatcher, dead)
    now = dispatcher.clock.advance(dispatcher.settings.lease_ttl_seconds + 1)
    assert reap_timeout(db_url, dead, 1, lease.lease_token, now) == "Dead"
    _not_claimed(dispatcher, db_url, dead, "NotQueued")


def test_many_concurrent_claims_of_one_task_have_exactly_one_winner(
    dispatcher: Dispatcher, db_url: str
) -> None:
    threads, repetitions = 20, 30
    local = threading.local()
    clients: list[httpx.Client] = []
    clients_lock = threading.Lock()

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = httpx.Client(
                base_url=dispatcher.base_url, headers=dispatcher.worker.headers, timeout=30
            )
            with clients_lock:
                clients.append(local.client)
        own: httpx.Client = local.client
        return own

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for _ in range(repetitions):
                task_id = create_task(dispatcher)["task_id"]
                barrier = threading.Barrier(threads)

                def race(
                    worker: int, task_id: str = task_id, barrier: threading.Barrier = barrier
                ) -> dict[str, object]:
                    own = client()
                    barrier.wait(timeout=30)
                    response = own.post(
                        "/internal/task-claim",
                        json={"task_id": task_id, "worker_id": f"worker-{worker}"},
                    )
                    assert response.status_code == 200, response.text
                    body: dict[str, object] = response.json()
                    return body

                results = list(pool.map(race, range(threads)))
                winners = [body for body in results if body["status"] == "Claimed"]
                losers = [body for body in results if body["status"] != "Claimed"]
                assert len(winners) == 1, results
                assert losers == [{"status": "NotClaimed", "reason": "AlreadyRunning"}] * (
                    threads - 1
                )
                (attempt,) = attempt_rows(db_url, task_id)
                assert str(attempt["lease_token"]) == winners[0]["lease_token"]
                row = task_row(db_url, task_id)
                assert row is not None and str(row["lease_token"]) == winners[0]["lease_token"]
    finally:
        for each in clients:
            each.close()
    assert row_counts(db_url)["task_attempts"] == repetitions


def test_a_queued_task_past_expires_at_is_not_claimed(dispatcher: Dispatcher, db_url: str) -> None:
    expires_at = dispatcher.clock.now() + timedelta(seconds=30)
    task = create_task(dispatcher, operator="echo", expires_at=expires_at.isoformat())
    dispatcher.clock.advance(31)
    response = claim(dispatcher, task["task_id"])
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "NotClaimed", "reason": "NotQueued"}
    assert task_row(db_url, task["task_id"])["status"] == "Queued"
