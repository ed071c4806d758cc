"""`/internal/task-complete`: Running -> Completed / Failed / Dead, repeats, conflicting repeats,
and late replies after an (emulated) lease timeout."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from taskplat.common.contracts import CompleteResponse, DeadLetterRecord
from taskplat.testkit.dispatcher_calls import (
    Lease,
    assert_rejected,
    cancel,
    claimed,
    complete,
    create_task,
    cursor_event,
    emit_events,
    get_task,
    output,
    race,
)
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import (
    attempt_rows,
    event_rows,
    outbox_rows,
    output_rows,
    promote_retry,
    reap_timeout,
    row_counts,
    task_row,
    task_state,
)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def accepted(response_text: str, status_code: int, task_status: str, repeated: bool) -> None:
    assert status_code == 200, response_text
    body = CompleteResponse.model_validate_json(response_text)
    assert (body.status, body.task_status, body.repeated) == ("Accepted", task_status, repeated)


def test_completed_commits_result_outputs_events_and_the_attempt_record(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"], "worker-7")
    dataset, version = str(uuid4()), str(uuid4())
    early = cursor_event(5, dataset, version)
    assert emit_events(dispatcher, lease, [early]).json()["accepted"] == 1
    now = dispatcher.clock.advance(12)
    outputs = [output(0), output(1, location=None, cursor=None, row_count=None)]
    response = complete(
        dispatcher,
        lease,
        outputs=outputs,
        events=[early, cursor_event(6, dataset, version)],
        result={"rows": 21000, "nested": {"ok": True}},
    )
    accepted(response.text, response.status_code, "Completed", repeated=False)

    row = task_row(db_url, lease.task_id)
    assert row is not None
    assert row["status"] == "Completed"
    assert row["attempt"] == 1 and row["attempt_outcome"] == "Completed"
    assert row["result"] == {"rows": 21000, "nested": {"ok": True}}
    assert row["finished_at"] == now
    assert row["lease_expires_at"] is None and row["next_retry_at"] is None

    stored_outputs = output_rows(db_url, lease.task_id)
    assert [each["output_index"] for each in stored_outputs] == [0, 1]
    for stored, sent in zip(stored_outputs, outputs, strict=True):
        assert stored["attempt"] == 1
        assert str(stored["dataset_uuid"]) == sent["dataset_uuid"]
        assert str(stored["dataset_version"]) == sent["dataset_version"]
        assert (stored["location"], stored["cursor"], stored["row_count"]) == (
            sent["location"],
            sent["cursor"],
            sent["row_count"],
        )
        assert stored["committed_at"] == now
    # The event sent earlier is not stored twice.
    assert sorted(event["cursor"] for event in event_rows(db_url, lease.task_id)) == [5, 6]

    (attempt,) = attempt_rows(db_url, lease.task_id)
    assert attempt["outcome"] == "Completed"
    assert attempt["finished_at"] == now and attempt["error"] is None

    view = get_task(dispatcher, lease.task_id)
    assert view["status"] == "Completed"
    assert view["result"] == {"rows": 21000, "nested": {"ok": True}}
    assert [each["output_index"] for each in view["outputs"]] == [0, 1]
    assert view["attempts"][0]["outcome"] == "Completed"
    assert ts(view["attempts"][0]["finished_at"]) == now
    assert ts(view["finished_at"]) == now
    # The creation's wake-up, and one routing row per event stored with the completion.
    kinds = [each["kind"] for each in outbox_rows(db_url, lease.task_id)]
    assert kinds == ["enqueue_task"] + ["route_event"] * len(event_rows(db_url, lease.task_id))


def test_outputs_must_be_unique_per_output_index(dispatcher: Dispatcher, db_url: str) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    before = task_state(db_url, lease.task_id)
    response = complete(dispatcher, lease, outputs=[output(0), output(0)])
    assert response.status_code == 422, response.text
    assert "output_index" in response.text
    assert task_state(db_url, lease.task_id) == before


def test_failed_schedules_retries_with_backoff_then_dies_with_a_dead_letter(
    dispatcher: Dispatcher, db_url: str
) -> None:
    base, cap = 10.0, 15.0
    task_id = create_task(
        dispatcher, max_attempts=3, backoff_base_seconds=base, backoff_max_seconds=cap
    )["task_id"]
    for attempt, ceiling in ((1, base), (2, min(cap, 2 * base))):
        lease = claimed(dispatcher, task_id)
        assert lease.attempt == attempt
        now = dispatcher.clock.advance(3)
        response = complete(dispatcher, lease, "Failed", error_message=f"boom {attempt}")
        accepted(response.text, response.status_code, "Failed", repeated=False)
        row = task_row(db_url, task_id)
        assert row is not None
        assert row["status"] == "Failed" and row["attempt"] == attempt
        assert row["attempt_outcome"] == "Failed"
        assert now <= row["next_retry_at"] <= now + timedelta(seconds=ceiling)
        assert row["last_error"] == f"boom {attempt}"
        assert row["finished_at"] is None and row["dead_reason"] is None
        assert row["lease_expires_at"] is None
        history = attempt_rows(db_url, task_id)
        assert (history[-1]["outcome"], history[-1]["error"]) == ("Failed", f"boom {attempt}")
        assert history[-1]["finished_at"] == now
        view = get_task(dispatcher, task_id)
        assert view["status"] == "Failed" and view["last_error"] == f"boom {attempt}"
        assert ts(view["next_retry_at"]) == row["next_retry_at"]
        # A retry is not announced before the scheduler promotes it.
        assert len(outbox_rows(db_url, task_id)) == attempt
        assert promote_retry(db_url, task_id, attempt, row["next_retry_at"]) == (attempt + 1)

    lease = claimed(dispatcher, task_id)
    assert lease.attempt == 3
    now = dispatcher.clock.advance(3)
    response = complete(dispatcher, lease, "Failed", error_message="final")
    accepted(response.text, response.status_code, "Dead", repeated=False)
    row = task_row(db_url, task_id)
    assert row is not None
    assert (row["status"], row["dead_reason"], row["attempt"]) == ("Dead", "AttemptsExhausted", 3)
    assert row["next_retry_at"] is None and row["finished_at"] == now
    dead_letters = [each for each in outbox_rows(db_url, task_id) if each["kind"] == "dead_letter"]
    assert len(dead_letters) == 1
    record = DeadLetterRecord.model_validate(dead_letters[0]["payload"])
    assert str(record.task_id) == task_id
    assert (record.attempt, record.max_attempts, record.dead_reason, record.last_error) == (
        3,
        3,
        "AttemptsExhausted",
        "final",
    )
    assert record.died_at == now
    assert dead_letters[0]["queue"] == "default" and dead_letters[0]["sent_at"] is None
    assert [each["outcome"] for each in attempt_rows(db_url, task_id)] == ["Failed"] * 3


def test_retry_after_seconds_overrides_the_backoff(dispatcher: Dispatcher, db_url: str) -> None:
    for retry_after in (0, 42.5):
        task_id = create_task(dispatcher, backoff_base_seconds=1000)["task_id"]
        lease = claimed(dispatcher, task_id)
        now = dispatcher.clock.advance(1)
        response = complete(dispatcher, lease, "Failed", retry_after_seconds=retry_after)
        accepted(response.text, response.status_code, "Failed", repeated=False)
        row = task_row(db_url, task_id)
        assert row is not None
        assert row["next_retry_at"] == now + timedelta(seconds=retry_after)


def test_a_repeated_completion_is_acknowledged_and_changes_nothing(
    dispatcher: Dispatcher, db_url: str
) -> None:
    cases: list[tuple[dict[str, Any], str, dict[str, Any]]] = [
        (
            {},
            "Completed",
            {"outputs": [output(0)], "events": [cursor_event(1)], "result": {"a": 1}},
        ),
        ({}, "Failed", {"error_message": "nope"}),
        ({"max_attempts": 1}, "Failed", {"error_message": "last"}),
    ]
    for create_fields, status, fields in cases:
        lease = claimed(dispatcher, create_task(dispatcher, **create_fields)["task_id"])
        first = complete(dispatcher, lease, status, **fields)
        assert first.status_code == 200, first.text
        task_status = first.json()["task_status"]
        before = task_state(db_url, lease.task_id)
        counts = row_counts(db_url)
        dispatcher.clock.advance(5)
        again = complete(dispatcher, lease, status, **fields)
        accepted(again.text, again.status_code, task_status, repeated=True)
        assert task_state(db_url, lease.task_id) == before
        assert row_counts(db_url) == counts


def test_a_different_completion_of_an_ended_attempt_answers_not_running(
    dispatcher: Dispatcher, db_url: str
) -> None:
    def ended(status: str, **fields: object) -> Lease:
        lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
        assert complete(dispatcher, lease, status, **fields).status_code == 200
        return lease

    cases: list[tuple[Lease, str, dict[str, Any]]] = [
        (ended("Completed", result={"a": 1}), "Completed", {"result": {"a": 2}}),
        (ended("Completed"), "Completed", {"outputs": [output(0)]}),
        (ended("Completed"), "Failed", {"error_message": "late failure"}),
        (ended("Failed", error_message="x"), "Completed", {}),
        (ended("Failed", error_message="x"), "Failed", {"error_message": "y"}),
    ]
    for lease, status, fields in cases:
        before = task_state(db_url, lease.task_id)
        assert_rejected(complete(dispatcher, lease, status, **fields), "NotRunning")
        assert task_state(db_url, lease.task_id) == before


def _timed_out(dispatcher: Dispatcher, db_url: str, max_attempts: int) -> tuple[Lease, str]:
    """A lease timeout by the reaper; `max_attempts` bounds the processing attempts too (a lost
    worker spends those), so 1 makes the timeout Dead."""
    task = create_task(dispatcher, max_attempts=max_attempts, max_processing_attempts=max_attempts)
    lease = claimed(dispatcher, task["task_id"])
    now = dispatcher.clock.advance(dispatcher.settings.lease_ttl_seconds + 1)
    status = reap_timeout(db_url, lease.task_id, 1, lease.lease_token, now)
    assert status is not None
    return lease, status


def test_a_late_success_after_a_lease_timeout_is_accepted(
    dispatcher: Dispatcher, db_url: str
) -> None:
    for max_attempts, timed_out_status in ((3, "Failed"), (1, "Dead")):
        lease, status = _timed_out(dispatcher, db_url, max_attempts)
        assert status == timed_out_status
        now = dispatcher.clock.advance(2)
        late: dict[str, Any] = {
            "outputs": [output(0)],
            "events": [cursor_event(9)],
            "result": {"late": 1},
        }
        response = complete(dispatcher, lease, **late)
        accepted(response.text, response.status_code, "Completed", repeated=False)
        row = task_row(db_url, lease.task_id)
        assert row is not None
        assert (row["status"], row["attempt"], row["attempt_outcome"]) == (
            "Completed",
            1,
            "Completed",
        )
        assert row["result"] == {"late": 1}
        assert row["next_retry_at"] is None and row["dead_reason"] is None
        assert row["finished_at"] == now
        assert len(output_rows(db_url, lease.task_id)) == 1
        assert len(event_rows(db_url, lease.task_id)) == 1
        (attempt,) = attempt_rows(db_url, lease.task_id)
        assert attempt["outcome"] == "Completed"
        # ... and its repeat is acknowledged.
        again = complete(dispatcher, lease, **late)
        accepted(again.text, again.status_code, "Completed", repeated=True)


def test_a_late_reply_is_refused_once_a_newer_attempt_started_or_the_task_was_canceled(
    dispatcher: Dispatcher, db_url: str
) -> None:
    # A late failure is not a late success: the timeout already decided.
    lease, _ = _timed_out(dispatcher, db_url, 3)
    before = task_state(db_url, lease.task_id)
    assert_rejected(complete(dispatcher, lease, "Failed", error_message="late"), "NotRunning")
    assert task_state(db_url, lease.task_id) == before

    # The scheduler promoted the retry (attempt 2 Queued), then a worker claimed it.
    assert promote_retry(db_url, lease.task_id, 1, dispatcher.clock.now()) == 2
    before = task_state(db_url, lease.task_id)
    assert_rejected(complete(dispatcher, lease, result={"late": 1}), "StaleAttempt")
    assert task_state(db_url, lease.task_id) == before
    claimed(dispatcher, lease.task_id)
    before = task_state(db_url, lease.task_id)
    assert_rejected(complete(dispatcher, lease, outputs=[output(0)]), "StaleAttempt")
    assert task_state(db_url, lease.task_id) == before

    # Timed out, then canceled before the late reply arrived.
    for max_attempts in (3, 1):
        lease, _ = _timed_out(dispatcher, db_url, max_attempts)
        if max_attempts == 3:
            assert cancel(dispatcher, lease.task_id).status_code == 200
        else:  # Dead cannot be canceled
            assert cancel(dispatcher, lease.task_id).status_code == 409
            continue
        before = task_state(db_url, lease.task_id)
        assert_rejected(complete(dispatcher, lease, outputs=[output(0)]), "Canceled")
        assert task_state(db_url, lease.task_id) == before


def test_a_holder_reporting_canceled_for_a_task_nobody_canceled_is_refused(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    before = task_state(db_url, lease.task_id)
    assert_rejected(
        complete(dispatcher, lease, "Canceled", events=[cursor_event(1)]), "NotCanceled"
    )
    batch = dispatcher.worker.post(
        "/internal/task-complete-batch",
        json={"completions": [{**lease.fence(), "status": "Canceled"}]},
    )
    assert batch.status_code == 200, batch.text
    (result,) = batch.json()["results"]
    assert (result["status_code"], result["body"]["reason"]) == (409, "NotCanceled")
    assert task_state(db_url, lease.task_id) == before
    # The task still runs: its holder completes it.
    accepted(complete(dispatcher, lease).text, 200, "Completed", repeated=False)
    # A Canceled report of a task that ended otherwise is a different completion: NotRunning.
    assert_rejected(complete(dispatcher, lease, "Canceled"), "NotRunning")


def test_a_late_success_of_a_dead_letter_task_sends_a_resolved_record(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease, status = _timed_out(dispatcher, db_url, 1)
    assert status == "Dead"
    died = task_row(db_url, lease.task_id)
    assert died is not None
    first = [r for r in outbox_rows(db_url, lease.task_id) if r["kind"] == "dead_letter"]
    assert len(first) == 1  # the reaper's dead letter
    now = dispatcher.clock.advance(3)
    response = complete(dispatcher, lease, result={"late": True})
    accepted(response.text, response.status_code, "Completed", repeated=False)
    letters = [r for r in outbox_rows(db_url, lease.task_id) if r["kind"] == "dead_letter"]
    assert len(letters) == len(first) + 1
    record = DeadLetterRecord.model_validate(letters[-1]["payload"])
    assert (record.record, record.task_id, record.attempt) == ("resolved", UUID(lease.task_id), 1)
    assert record.dead_reason == died["dead_reason"] == "ProcessingAttemptsExceeded"
    assert record.died_at == died["finished_at"] and record.resolved_at == now
    # Its repeat sends nothing more; a late success of a Failed (not dead-lettered) task sends
    # no record at all.
    complete(dispatcher, lease, result={"late": True})
    assert len([r for r in outbox_rows(db_url, lease.task_id) if r["kind"] == "dead_letter"]) == (
        len(letters)
    )
    lease, status = _timed_out(dispatcher, db_url, 3)
    assert status == "Failed"
    assert complete(dispatcher, lease).status_code == 200
    assert [r for r in outbox_rows(db_url, lease.task_id) if r["kind"] == "dead_letter"] == []


def test_concurrent_identical_completions_apply_once(dispatcher: Dispatcher, db_url: str) -> None:
    for status in ("Completed", "Failed"):
        for _ in range(3):
            lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
            body = {
                **lease.fence(),
                "status": status,
                "outputs": [output(0), output(1)] if status == "Completed" else [],
                "events": [cursor_event(1), cursor_event(2)],
                "error_message": "e" if status == "Failed" else None,
            }
            answers = race(
                dispatcher, dispatcher.worker, [("POST", "/internal/task-complete", body)] * 8
            )
            assert all(answer.status_code == 200 for answer in answers), [
                answer.text for answer in answers
            ]
            repeated = sorted(answer.json()["repeated"] for answer in answers)
            assert repeated == [False] + [True] * 7
            assert len(event_rows(db_url, lease.task_id)) == 2
            assert len(output_rows(db_url, lease.task_id)) == (2 if status == "Completed" else 0)
            (attempt,) = attempt_rows(db_url, lease.task_id)
            assert attempt["outcome"] == status


def test_concurrent_different_completions_have_one_winner(
    dispatcher: Dispatcher, db_url: str
) -> None:
    for _ in range(3):
        lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
        # Six different successes and two different failures of the same attempt.
        bodies = [{"status": "Completed", "result": {"n": n}} for n in range(6)] + [
            {"status": "Failed", "error_message": f"e{n}"} for n in range(6, 8)
        ]
        calls = [("POST", "/internal/task-complete", {**lease.fence(), **b}) for b in bodies]
        answers = race(dispatcher, dispatcher.worker, calls)
        winners = [n for n, answer in enumerate(answers) if answer.status_code == 200]
        assert len(winners) == 1, [answer.text for answer in answers]
        for answer in answers:
            if answer.status_code != 200:
                assert_rejected(answer, "NotRunning")
        row = task_row(db_url, lease.task_id)
        assert row is not None
        if winners[0] < 6:
            assert row["status"] == "Completed" and row["result"] == {"n": winners[0]}
        else:
            assert row["status"] == "Failed"
