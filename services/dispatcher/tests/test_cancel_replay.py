"""`PUT /tasks/{id}/cancel` from every cancelable state (and what the running holder then sees),
and `POST /tasks/{id}/retry`: a replay of a Dead or Canceled task with a fresh attempt budget."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from taskplat.testkit.dispatcher_calls import (
    Lease,
    assert_rejected,
    cancel,
    claim,
    claimed,
    complete,
    create_task,
    cursor_event,
    emit_events,
    heartbeat,
    output,
    replay,
)
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import (
    attempt_rows,
    outbox_rows,
    promote_retry,
    reap_timeout,
    row_counts,
    task_row,
    task_state,
)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _failed(dispatcher: Dispatcher) -> str:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    response = complete(dispatcher, lease, "Failed", error_message="x")
    assert response.json()["task_status"] == "Failed"
    return lease.task_id


def _dead(dispatcher: Dispatcher) -> str:
    lease = claimed(dispatcher, create_task(dispatcher, max_attempts=1)["task_id"])
    assert complete(dispatcher, lease, "Failed").json()["task_status"] == "Dead"
    return lease.task_id


def _completed(dispatcher: Dispatcher) -> str:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    assert complete(dispatcher, lease).json()["task_status"] == "Completed"
    return lease.task_id


def _scheduled(dispatcher: Dispatcher) -> str:
    later = dispatcher.clock.now() + timedelta(hours=1)
    task = create_task(dispatcher, scheduled_for=later.isoformat())
    assert task["status"] == "Scheduled"
    return str(task["task_id"])


def test_cancel_from_scheduled_queued_and_failed(dispatcher: Dispatcher, db_url: str) -> None:
    for make in (_scheduled, lambda d: str(create_task(d)["task_id"]), _failed):
        task_id = make(dispatcher)
        outbox_before = outbox_rows(db_url, task_id)
        now = dispatcher.clock.advance(1)
        response = cancel(dispatcher, task_id)
        assert response.status_code == 200, response.text
        view = response.json()
        assert view["status"] == "Canceled" and view["task_id"] == task_id
        assert ts(view["finished_at"]) == now
        assert view["next_retry_at"] is None
        assert outbox_rows(db_url, task_id) == outbox_before
        # Canceling again is a no-op that answers the task.
        before = task_state(db_url, task_id)
        dispatcher.clock.advance(1)
        again = cancel(dispatcher, task_id)
        assert again.status_code == 200 and again.json() == view
        assert task_state(db_url, task_id) == before
        assert claim(dispatcher, task_id).json() == {"status": "NotClaimed", "reason": "Canceled"}


def test_cancel_of_a_running_task_reaches_its_holder(dispatcher: Dispatcher, db_url: str) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"], "worker-9")
    now = dispatcher.clock.advance(4)
    response = cancel(dispatcher, lease.task_id)
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["status"] == "Canceled"
    assert view["attempts"][0]["outcome"] == "Canceled"
    assert ts(view["attempts"][0]["finished_at"]) == now
    row = task_row(db_url, lease.task_id)
    assert row is not None and row["attempt_outcome"] == "Canceled"
    assert row["lease_expires_at"] is None

    before = task_state(db_url, lease.task_id)
    dispatcher.clock.advance(1)
    assert_rejected(heartbeat(dispatcher, lease), "Canceled")
    assert_rejected(emit_events(dispatcher, lease, [cursor_event(1)]), "Canceled")
    for status, fields in (
        ("Completed", {"outputs": [output(0)], "result": {"a": 1}}),
        ("Failed", {"error_message": "stopped"}),
    ):
        assert_rejected(complete(dispatcher, lease, status, **fields), "Canceled")
    # The holder acknowledges the cancellation: 200, nothing changes (its events are dropped).
    for _ in range(2):
        ack = complete(dispatcher, lease, "Canceled", events=[cursor_event(2)])
        assert ack.status_code == 200, ack.text
        assert ack.json()["task_status"] == "Canceled"
    assert task_state(db_url, lease.task_id) == before


def test_cancel_of_completed_or_dead_answers_409_and_unknown_404(
    dispatcher: Dispatcher, db_url: str
) -> None:
    for task_id in (_completed(dispatcher), _dead(dispatcher)):
        before = task_state(db_url, task_id)
        response = cancel(dispatcher, task_id)
        assert response.status_code == 409, response.text
        assert response.json()["error"] == "conflict"
        assert task_state(db_url, task_id) == before
    counts = row_counts(db_url)
    missing = cancel(dispatcher, str(uuid4()))
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert row_counts(db_url) == counts


def _replayed(dispatcher: Dispatcher, db_url: str, task_id: str) -> dict[str, Any]:
    row = task_row(db_url, task_id)
    assert row is not None
    outbox_before = len(outbox_rows(db_url, task_id))
    now = dispatcher.clock.advance(30)
    response = replay(dispatcher, task_id)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    assert view["status"] == "Queued"
    assert view["attempt"] == row["attempt"] + 1
    for field in ("result", "worker_id", "started_at", "finished_at", "next_retry_at"):
        assert view[field] is None, field
    outbox = outbox_rows(db_url, task_id)
    assert len(outbox) == outbox_before + 1
    assert outbox[-1]["kind"] == "enqueue_task" and outbox[-1]["created_at"] == now
    assert outbox[-1]["payload"] == {"task_id": task_id}
    return view


def test_replay_of_a_dead_task_gets_a_fresh_attempt_budget(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task_id = create_task(dispatcher, max_attempts=2, backoff_base_seconds=0)["task_id"]

    def fail_all(first_attempt: int) -> None:
        for attempt in (first_attempt, first_attempt + 1):
            lease = claimed(dispatcher, task_id)
            assert lease.attempt == attempt
            status = complete(dispatcher, lease, "Failed", error_message=f"e{attempt}")
            if attempt == first_attempt:
                assert status.json()["task_status"] == "Failed"
                assert promote_retry(db_url, task_id, attempt, dispatcher.clock.now())
            else:
                assert status.json()["task_status"] == "Dead"

    fail_all(1)
    view = _replayed(dispatcher, db_url, task_id)
    assert view["attempt"] == 3 and view["max_attempts"] == 2
    assert view["dead_reason"] is None
    assert [each["attempt"] for each in view["attempts"]] == [1, 2]
    # A fresh budget: it can fail max_attempts more times before it is Dead again.
    fail_all(3)
    row = task_row(db_url, task_id)
    assert row is not None and (row["status"], row["attempt"]) == ("Dead", 4)
    assert [each["outcome"] for each in attempt_rows(db_url, task_id)] == ["Failed"] * 4
    kinds = [each["kind"] for each in outbox_rows(db_url, task_id)]
    assert kinds.count("dead_letter") == 2


def test_replay_of_a_canceled_task_fences_out_the_old_holder(
    dispatcher: Dispatcher, db_url: str
) -> None:
    old = claimed(dispatcher, create_task(dispatcher)["task_id"])
    assert cancel(dispatcher, old.task_id).status_code == 200
    view = _replayed(dispatcher, db_url, old.task_id)
    assert view["attempt"] == 2
    before = task_state(db_url, old.task_id)
    assert_rejected(heartbeat(dispatcher, old), "StaleAttempt")
    assert_rejected(complete(dispatcher, old, "Canceled"), "StaleAttempt")
    assert task_state(db_url, old.task_id) == before
    new = claimed(dispatcher, old.task_id)
    assert new.attempt == 2
    assert complete(dispatcher, new).json()["task_status"] == "Completed"

    # A task canceled before it ever ran is replayed too.
    never_ran = create_task(dispatcher)["task_id"]
    assert cancel(dispatcher, never_ran).status_code == 200
    assert _replayed(dispatcher, db_url, never_ran)["attempt"] == 2


def test_replay_of_other_states_answers_409_and_unknown_404(
    dispatcher: Dispatcher, db_url: str
) -> None:
    running = create_task(dispatcher)["task_id"]
    lease = claimed(dispatcher, running)
    timed_out = create_task(dispatcher)["task_id"]
    timed_out_lease = claimed(dispatcher, timed_out)
    assert (
        reap_timeout(
            db_url,
            timed_out,
            1,
            timed_out_lease.lease_token,
            dispatcher.clock.advance(dispatcher.settings.lease_ttl_seconds + 1),
        )
        == "Failed"
    )
    for task_id in (
        _scheduled(dispatcher),
        create_task(dispatcher)["task_id"],
        running,
        _failed(dispatcher),
        timed_out,
        _completed(dispatcher),
    ):
        before = task_state(db_url, task_id)
        response = replay(dispatcher, task_id)
        assert response.status_code == 409, response.text
        assert response.json()["error"] == "conflict"
        assert task_state(db_url, task_id) == before
    assert heartbeat(dispatcher, Lease(running, 1, lease.lease_token)).status_code == 200
    counts = row_counts(db_url)
    missing = replay(dispatcher, str(uuid4()))
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert row_counts(db_url) == counts
