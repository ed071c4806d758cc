"""Failure budgets of `task-complete`: a drained attempt (the worker shut down) spends a processing
attempt, not one of `max_attempts`; a permanent failure (`retryable: false`) is Dead at once;
`on_exhausted: discard` (task, operator default or job) sends no dead-letter record."""

from __future__ import annotations

import pytest
from dispatcher_metrics import scrape

from taskplat.common.contracts import DeadLetterRecord
from taskplat.testkit.dispatcher_calls import claimed, complete, create_task, get_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import outbox_rows, promote_retry, task_row


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    return {"operator_defaults": {"quiet": {"on_exhausted": "discard"}}}


DRAINED = {"error_message": "worker shutting down", "retry_after_seconds": 0, "reason": "Drained"}


def _dead_letters(db_url: str, task_id: str) -> list[DeadLetterRecord]:
    return [
        DeadLetterRecord.model_validate(row["payload"])
        for row in outbox_rows(db_url, task_id)
        if row["kind"] == "dead_letter"
    ]


def test_drained_attempts_do_not_spend_max_attempts_until_max_processing_attempts(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task_id = create_task(dispatcher, max_attempts=1, max_processing_attempts=3)["task_id"]
    for attempt in (1, 2):
        lease = claimed(dispatcher, task_id)
        assert lease.attempt == attempt
        response = complete(dispatcher, lease, "Failed", **DRAINED)
        assert response.status_code == 200, response.text
        assert response.json()["task_status"] == "Failed"
        row = task_row(db_url, task_id)
        assert row is not None
        assert row["next_retry_at"] == dispatcher.clock.now()  # at once
        assert row["processing_attempts"] == attempt and row["attempt_outcome"] == "Drained"
        assert promote_retry(db_url, task_id, attempt, dispatcher.clock.now())
    view = get_task(dispatcher, task_id)
    assert (view["attempt"], view["counted_attempts"], view["processing_attempts"]) == (3, 1, 2)
    assert [a["outcome"] for a in view["attempts"]] == ["Drained", "Drained"]
    assert [a["error"] for a in view["attempts"]] == ["worker shutting down"] * 2
    assert _dead_letters(db_url, task_id) == []

    # The third drain uses up the processing budget: Dead, with its dead letter.
    lease = claimed(dispatcher, task_id)
    response = complete(dispatcher, lease, "Failed", **DRAINED)
    assert response.json()["task_status"] == "Dead", response.text
    view = get_task(dispatcher, task_id)
    assert view["dead_reason"] == "ProcessingAttemptsExceeded"
    assert view["processing_attempts"] == 3 and view["finished_at"] is not None
    (letter,) = _dead_letters(db_url, task_id)
    assert (letter.dead_reason, letter.attempt) == ("ProcessingAttemptsExceeded", 3)
    metrics = scrape(dispatcher)
    failed = metrics.series("taskplat_tasks_failed_total", "operator", "reason")
    assert failed == {("echo", "Drained"): 3}
    dead = metrics.series("taskplat_tasks_dead_total", "operator", "reason")
    assert dead == {("echo", "ProcessingAttemptsExceeded"): 1}
    # A replay gives fresh budgets: both counters start again.
    replayed = dispatcher.api.post(f"/tasks/{task_id}/retry")
    assert replayed.status_code == 200, replayed.text
    view = replayed.json()
    assert (view["attempt"], view["counted_attempts"], view["processing_attempts"]) == (4, 1, 0)


def test_a_reported_failure_still_counts_after_drains(dispatcher: Dispatcher, db_url: str) -> None:
    task_id = create_task(dispatcher, max_attempts=2)["task_id"]
    lease = claimed(dispatcher, task_id)
    assert complete(dispatcher, lease, "Failed", **DRAINED).json()["task_status"] == "Failed"
    assert promote_retry(db_url, task_id, 1, dispatcher.clock.now())
    lease = claimed(dispatcher, task_id)
    assert (
        complete(dispatcher, lease, "Failed", error_message="x").json()["task_status"] == "Failed"
    )
    assert task_row(db_url, task_id)["next_retry_at"] > dispatcher.clock.now()  # the backoff
    assert promote_retry(db_url, task_id, 2, task_row(db_url, task_id)["next_retry_at"])
    lease = claimed(dispatcher, task_id)
    assert complete(dispatcher, lease, "Failed", error_message="y").json()["task_status"] == "Dead"
    view = get_task(dispatcher, task_id)
    assert (view["dead_reason"], view["counted_attempts"], view["attempt"]) == (
        "AttemptsExhausted",
        2,
        3,
    )


def test_drained_completions_in_a_batch(dispatcher: Dispatcher, db_url: str) -> None:
    last = claimed(dispatcher, create_task(dispatcher, max_attempts=1)["task_id"])
    done = claimed(dispatcher, create_task(dispatcher, max_processing_attempts=1)["task_id"])
    response = dispatcher.worker.post(
        "/internal/task-complete-batch",
        json={
            "completions": [
                {**lease.fence(), "status": "Failed", **DRAINED} for lease in (last, done)
            ]
        },
    )
    assert response.status_code == 200, response.text
    statuses = {r["task_id"]: r["body"]["task_status"] for r in response.json()["results"]}
    assert statuses == {last.task_id: "Failed", done.task_id: "Dead"}
    assert task_row(db_url, done.task_id)["dead_reason"] == "ProcessingAttemptsExceeded"
    assert [a["outcome"] for a in get_task(dispatcher, last.task_id)["attempts"]] == ["Drained"]


def test_failure_fields_belong_to_failures(dispatcher: Dispatcher) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"])
    for status, fields in (
        ("Completed", {"reason": "Drained"}),
        ("Completed", {"retryable": False}),
        ("Failed", {"reason": "Drained", "retryable": False}),
        ("Failed", {"reason": "Lost"}),
    ):
        response = complete(dispatcher, lease, status, **fields)
        assert response.status_code == 422, response.text
    assert get_task(dispatcher, lease.task_id)["status"] == "Running"


def test_a_permanent_failure_is_dead_at_once_with_its_reason(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = claimed(dispatcher, create_task(dispatcher, max_attempts=5)["task_id"])
    response = complete(dispatcher, lease, "Failed", error_message="card declined", retryable=False)
    assert response.json()["task_status"] == "Dead", response.text
    view = get_task(dispatcher, lease.task_id)
    assert (view["dead_reason"], view["last_error"]) == ("PermanentFailure", "card declined")
    assert view["next_retry_at"] is None and view["finished_at"] is not None
    (letter,) = _dead_letters(db_url, lease.task_id)
    assert (letter.dead_reason, letter.last_error) == ("PermanentFailure", "card declined")
    # The batch route, too.
    other = claimed(dispatcher, create_task(dispatcher, max_attempts=5)["task_id"])
    batch = dispatcher.worker.post(
        "/internal/task-complete-batch",
        json={"completions": [{**other.fence(), "status": "Failed", "retryable": False}]},
    )
    assert batch.json()["results"][0]["body"]["task_status"] == "Dead", batch.text
    assert task_row(db_url, other.task_id)["dead_reason"] == "PermanentFailure"
    assert len(_dead_letters(db_url, other.task_id)) == 1


def test_on_exhausted_discard_sends_no_dead_letter(dispatcher: Dispatcher, db_url: str) -> None:
    single = claimed(
        dispatcher, create_task(dispatcher, max_attempts=1, on_exhausted="discard")["task_id"]
    )
    assert complete(dispatcher, single, "Failed", error_message="x").json()["task_status"] == "Dead"
    by_default = create_task(dispatcher, operator="quiet", max_attempts=1)
    assert by_default["on_exhausted"] == "discard"
    assert create_task(dispatcher)["on_exhausted"] == "dead_letter"
    in_batch = claimed(dispatcher, by_default["task_id"])
    batch = dispatcher.worker.post(
        "/internal/task-complete-batch",
        json={"completions": [{**in_batch.fence(), "status": "Failed", "retryable": False}]},
    )
    assert batch.json()["results"][0]["body"]["task_status"] == "Dead", batch.text
    for task_id in (single.task_id, in_batch.task_id):
        assert task_row(db_url, task_id)["status"] == "Dead"
        assert _dead_letters(db_url, task_id) == []


def test_a_job_chooses_for_its_tasks(dispatcher: Dispatcher, db_url: str) -> None:
    document = {
        "jobs": {
            "quiet": {"operator": "echo", "on_exhausted": "discard", "max_attempts": 1},
            "loud": {"operator": "echo", "max_attempts": 1},
        }
    }
    assert dispatcher.api.put("/dags/budgets", json=document).status_code in (200, 201)
    jobs = {job["name"]: job for job in dispatcher.api.get("/dags/budgets").json()["jobs"]}
    assert (jobs["quiet"]["on_exhausted"], jobs["loud"]["on_exhausted"]) == (
        "discard",
        "dead_letter",
    )
    for job, letters in (("quiet", 0), ("loud", 1)):
        run = dispatcher.api.post(f"/dags/budgets/jobs/{job}/runs", json={})
        assert run.status_code == 201, run.text
        lease = claimed(dispatcher, run.json()["task_id"])
        assert complete(dispatcher, lease, "Failed", error_message="x").json()["task_status"] == (
            "Dead"
        )
        assert len(_dead_letters(db_url, lease.task_id)) == letters
