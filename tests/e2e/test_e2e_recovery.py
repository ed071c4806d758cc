"""End to end, issue 4: crashes, lost messages, delays, retries, expiry and stale workers all end
in a correct state.

One stack for the module: two worker wrappers serve the `default` queue; nobody serves `idle`
(tasks there stay unclaimed unless a test claims them itself) nor, at first, `lost`.
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_stack import (
    LEASE_TTL_SECONDS,
    E2EStack,
    e2e_stack,
    marker_lines,
    new_marker,
    process_gone,
    read_pid,
)

from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(
    database_url: str, sqs_endpoint_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2EStack]:
    with e2e_stack(
        "recovery",
        tmp_path_factory.mktemp("stack-recovery"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=2,
        queues=("default", "idle", "lost"),
        worker_queues=("default",),
    ) as running:
        yield running


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_killed_wrapper_task_runs_again_and_completes_once(stack: E2EStack, tmp_path: Path) -> None:
    marker = new_marker(tmp_path)
    task = stack.create(
        "hang",
        config={"seconds": 4, "pid_dir": str(tmp_path), "marker": str(marker)},
        backoff_base_seconds=0.2,
        backoff_max_seconds=0.5,
    )
    task_id = task["task_id"]
    first_pid = read_pid(tmp_path, task_id, 1)
    running = stack.wait_status(task_id, "Running", timeout=10)
    service = running["worker_id"].rsplit(".", 1)[0]

    stack.stack.kill(service, signal.SIGKILL)

    # The operator dies with its wrapper; the lease expires, the reaper fails the attempt and the
    # scheduler queues the retry, which another wrapper runs.
    wait_for(lambda: process_gone(first_pid), timeout=10, what="the orphaned operator to die")
    done = stack.wait_status(task_id, "Completed", "Dead", timeout=LEASE_TTL_SECONDS + 30)
    assert done["status"] == "Completed"
    assert [a["outcome"] for a in done["attempts"]] == ["LeaseExpired", "Completed"]
    rows = stack.rows("completion_counts", ids=[task_id])
    assert rows[0]["completions"] == 1
    assert marker_lines(marker) == [f"{task_id} 2"]
    assert stack.stack.exits(service) == [-signal.SIGKILL]


def test_lost_wake_up_is_republished(stack: E2EStack) -> None:
    task = stack.create("echo", config={"lost": True}, queue="lost")
    task_id = task["task_id"]
    url = stack.task_queue_url("lost")

    # The wake-up reaches SQS; it is then lost before any worker sees it.
    def take_wake_ups() -> int:
        messages = stack.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        for message in messages:
            stack.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return len(messages)

    wait_for(take_wake_ups, timeout=20, what="the wake-up to reach SQS")
    sent_before = len(stack.rows("outbox_rows", task_id=task_id))
    assert stack.get(task_id)["status"] == "Queued"

    # Without a waiting claim, which would find the Queued task without any wake-up.
    worker = stack.stack.add_worker("lost", env={"TASKPLAT_WORKER_POLL_DISPATCHER": "false"})
    try:
        done = stack.wait_status(task_id, "Completed", "Dead", timeout=30)
    finally:
        stack.stack.remove(worker)

    assert done["status"] == "Completed"
    assert done["result"] == {"lost": True}
    republished = stack.rows("outbox_rows", task_id=task_id)
    assert len(republished) > sent_before
    assert {r["kind"] for r in republished} == {"enqueue_task"}


def test_delayed_task_runs_no_earlier_than_scheduled_for(stack: E2EStack) -> None:
    scheduled_for = datetime.now(UTC) + timedelta(seconds=3)
    task = stack.create("echo", config={"delayed": True}, scheduled_for=scheduled_for.isoformat())
    assert task["status"] == "Scheduled"

    done = stack.wait_status(task["task_id"], "Completed", "Dead", timeout=30)

    assert done["status"] == "Completed"
    assert _ts(done["attempts"][0]["started_at"]) >= scheduled_for


def _dead_letter_records(stack: E2EStack, task_id: str) -> list[dict[str, Any]]:
    found = []
    url = stack.dead_letter_queue_url
    messages = stack.sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30
    ).get("Messages", [])
    for message in messages:
        record = json.loads(message["Body"])
        if record.get("task_id") == task_id:
            found.append(record)
            stack.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return found


def test_exhausted_retries_end_dead_with_a_dead_letter_then_replay(stack: E2EStack) -> None:
    base, cap = 0.5, 1.0
    task = stack.create(
        "fail",
        config={"times": 4},
        max_attempts=3,
        backoff_base_seconds=base,
        backoff_max_seconds=cap,
    )
    task_id = task["task_id"]

    dead = stack.wait_status(task_id, "Dead", "Completed", timeout=60)

    assert dead["status"] == "Dead"
    assert dead["dead_reason"] == "AttemptsExhausted"
    attempts = dead["attempts"]
    assert [a["outcome"] for a in attempts] == ["Failed"] * 3
    assert all("failing on purpose" in (a["error"] or "") for a in attempts)
    for number, (earlier, later) in enumerate(itertools.pairwise(attempts), 1):
        gap = (_ts(later["started_at"]) - _ts(earlier["finished_at"])).total_seconds()
        # Full jitter: the delay is anywhere in [0, min(cap, base * 2**(n-1))]; the scheduler's
        # interval, the relay and the wake-up add a little.
        assert 0 <= gap <= min(cap, base * 2 ** (number - 1)) + 5, (number, gap)
    records = wait_for(
        lambda: _dead_letter_records(stack, task_id), timeout=30, what="the dead-letter record"
    )
    assert records[0]["dead_reason"] == "AttemptsExhausted"
    assert records[0]["attempt"] == 3
    assert records[0]["max_attempts"] == 3
    assert records[0]["operator"] == "fail"

    replayed = stack.api.post(f"/tasks/{task_id}/retry")

    assert replayed.status_code == 200, replayed.text
    # The answer is read after the replay committed: a worker's waiting claim may have taken the
    # task in between (it is woken by the replay's NOTIFY).
    assert replayed.json()["status"] in ("Queued", "Running")
    assert replayed.json()["attempt"] == 4
    done = stack.wait_status(task_id, "Completed", "Dead", timeout=60)
    assert done["status"] == "Completed"  # attempt 4 fails (4 <= times), attempt 5 succeeds
    assert [a["outcome"] for a in done["attempts"]] == ["Failed"] * 4 + ["Completed"]
    assert done["result"] == {"attempt": 5}


def test_expired_task_ends_dead(stack: E2EStack) -> None:
    expires_at = datetime.now(UTC) + timedelta(seconds=1)
    task = stack.create("echo", queue="idle", expires_at=expires_at.isoformat())

    dead = stack.wait_status(task["task_id"], "Dead", "Completed", timeout=20)

    assert dead["dead_reason"] == "Expired"
    assert dead["attempts"] == []


def _claim(stack: E2EStack, task_id: str, worker_id: str) -> dict[str, Any]:
    response = stack.internal.post(
        "/internal/task-claim", json={"task_id": task_id, "worker_id": worker_id}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _complete(stack: E2EStack, task_id: str, attempt: int, token: str) -> Any:
    return stack.internal.post(
        "/internal/task-complete",
        json={
            "task_id": task_id,
            "attempt": attempt,
            "lease_token": token,
            "status": "Completed",
            "result": {"by": f"attempt {attempt}"},
        },
    )


def test_stale_worker_completion_is_rejected(stack: E2EStack) -> None:
    task = stack.create("echo", queue="idle", backoff_base_seconds=0, max_attempts=3)
    task_id = task["task_id"]
    first = _claim(stack, task_id, "e2e-stale-worker")
    assert first["status"] == "Claimed" and first["attempt"] == 1

    # No heartbeat: the lease expires, the reaper fails attempt 1, the scheduler queues attempt 2.
    stack.wait_status(task_id, "Queued", timeout=LEASE_TTL_SECONDS + 20)
    second = wait_for(
        lambda: (c := _claim(stack, task_id, "e2e-new-worker"))["status"] == "Claimed" and c,
        timeout=10,
        what="attempt 2 to be claimable",
    )
    assert second["attempt"] == 2

    stale = _complete(stack, task_id, 1, first["lease_token"])

    assert stale.status_code == 409, stale.text
    assert stale.json() == {"status": "Rejected", "reason": "StaleAttempt", **_message(stale)}
    assert stack.get(task_id)["status"] == "Running"
    fresh = _complete(stack, task_id, 2, second["lease_token"])
    assert fresh.status_code == 200, fresh.text
    done = stack.get(task_id)
    assert done["status"] == "Completed"
    assert done["result"] == {"by": "attempt 2"}
    assert [a["outcome"] for a in done["attempts"]] == ["LeaseExpired", "Completed"]


def _message(response: Any) -> dict[str, Any]:
    body = response.json()
    return {"message": body["message"]} if "message" in body else {}
