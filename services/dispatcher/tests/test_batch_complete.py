"""`/internal/task-complete-batch`: each completion is its own guarded transition with the status
and body the single route would answer, a refused one writes nothing and cannot undo another's
acceptance, and a completion that cannot be stored fails alone. With `claim_next` the same call
claims the next tasks of a queue in the completions' transaction (one commit), at most `max`, and
a request refused as a whole claims nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from taskplat.common.contracts import ClaimedResponse, CompleteBatchResponse
from taskplat.testkit.dispatcher_calls import (
    Lease,
    cancel,
    claimed,
    complete,
    create_task,
    cursor_event,
    get_task,
    output,
)
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import (
    attempt_rows,
    event_rows,
    outbox_rows,
    output_rows,
    reap_timeout,
    task_row,
    task_state,
    task_xmin,
)

JsonDict = dict[str, Any]


def complete_batch(dispatcher: Dispatcher, completions: list[JsonDict]) -> list[JsonDict]:
    response = dispatcher.worker.post(
        "/internal/task-complete-batch", json={"completions": completions}
    )
    assert response.status_code == 200, response.text
    CompleteBatchResponse.model_validate_json(response.text)
    results: list[JsonDict] = response.json()["results"]
    assert [r["task_id"] for r in results] == [c["task_id"] for c in completions]
    return results


def running(dispatcher: Dispatcher, **fields: Any) -> Lease:
    return claimed(dispatcher, create_task(dispatcher, **fields)["task_id"])


def test_a_batch_answers_each_completion_as_the_single_route_would(
    dispatcher: Dispatcher, db_url: str
) -> None:
    ok = running(dispatcher)
    failed = running(dispatcher, max_attempts=3)
    dead = running(dispatcher, max_attempts=1)
    stale = running(dispatcher)
    repeat = running(dispatcher)
    assert complete(dispatcher, repeat, result={"n": 1}).status_code == 200
    canceled = running(dispatcher)
    assert cancel(dispatcher, canceled.task_id).status_code == 200
    canceled_done = running(dispatcher)
    assert cancel(dispatcher, canceled_done.task_id).status_code == 200
    ghost = Lease(str(uuid4()), 1, str(uuid4()))
    stale_before = task_state(db_url, stale.task_id)
    events = [cursor_event(1), cursor_event(2)]
    outputs = [output(0), output(1)]

    results = complete_batch(
        dispatcher,
        [
            {**ok.fence(), "status": "Completed", "result": {"ok": True}, "events": events,
             "outputs": outputs},
            {**failed.fence(), "status": "Failed", "error_message": "boom"},
            {**dead.fence(), "status": "Failed", "error_message": "fatal"},
            {**stale.fence(), "lease_token": str(uuid4()), "status": "Completed"},
            {**repeat.fence(), "status": "Completed", "result": {"n": 1}},
            {**canceled.fence(), "status": "Completed"},
            {**canceled_done.fence(), "status": "Canceled"},
            {**ghost.fence(), "status": "Completed"},
        ],
    )  # fmt: skip

    assert [(r["status_code"], r["body"].get("task_status") or r["body"].get("reason"))
            for r in results] == [
        (200, "Completed"), (200, "Failed"), (200, "Dead"), (409, "StaleLease"),
        (200, "Completed"), (409, "Canceled"), (200, "Canceled"), (404, "NotFound"),
    ]  # fmt: skip
    assert results[4]["body"]["repeated"] is True
    assert results[0]["body"] == {
        "status": "Accepted",
        "task_status": "Completed",
        "repeated": False,
    }
    assert results[3]["body"]["status"] == "Rejected"

    done = get_task(dispatcher, ok.task_id)
    assert done["result"] == {"ok": True}
    assert [o["output_index"] for o in done["outputs"]] == [0, 1]
    assert len(event_rows(db_url, ok.task_id)) == 2
    assert len(output_rows(db_url, ok.task_id)) == 2
    (attempt,) = attempt_rows(db_url, ok.task_id)
    assert attempt["outcome"] == "Completed" and attempt["completion_digest"]
    failed_row = task_row(db_url, failed.task_id)
    assert failed_row["status"] == "Failed" and failed_row["last_error"] == "boom"
    assert failed_row["next_retry_at"] is not None
    (failed_attempt,) = attempt_rows(db_url, failed.task_id)
    assert failed_attempt["outcome"] == "Failed" and failed_attempt["error"] == "boom"
    dead_letters = [r for r in outbox_rows(db_url, dead.task_id) if r["kind"] == "dead_letter"]
    assert len(dead_letters) == 1
    assert dead_letters[0]["payload"]["last_error"] == "fatal"
    assert dead_letters[0]["payload"]["dead_reason"] == "AttemptsExhausted"
    assert task_state(db_url, stale.task_id) == stale_before
    assert task_row(db_url, canceled.task_id)["status"] == "Canceled"


def test_a_repeated_batch_is_acknowledged_and_applies_nothing_again(
    dispatcher: Dispatcher, db_url: str
) -> None:
    leases = [running(dispatcher) for _ in range(3)]
    completions = [
        {
            **lease.fence(),
            "status": "Completed",
            "events": [cursor_event(7)],
            "outputs": [output(0)],
        }
        for lease in leases
    ]
    first = complete_batch(dispatcher, completions)
    assert [r["body"]["repeated"] for r in first] == [False] * 3
    states = [task_state(db_url, lease.task_id) for lease in leases]
    again = complete_batch(dispatcher, completions)
    assert [(r["status_code"], r["body"]["repeated"]) for r in again] == [(200, True)] * 3
    assert [task_state(db_url, lease.task_id) for lease in leases] == states
    # A different completion of an attempt that already ended is refused.
    different = [{**completions[0], "status": "Failed", "events": [], "outputs": []}]
    (refused,) = complete_batch(dispatcher, different)
    assert (refused["status_code"], refused["body"]["reason"]) == (409, "NotRunning")


def test_a_late_success_in_a_batch_is_accepted_after_a_lease_timeout(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = running(dispatcher)
    now = dispatcher.clock.advance(dispatcher.settings.lease_ttl_seconds + 1)
    assert reap_timeout(db_url, lease.task_id, 1, lease.lease_token, now) == "Failed"
    fresh = running(dispatcher)
    (late, other) = complete_batch(
        dispatcher,
        [{**lease.fence(), "status": "Completed", "result": {"late": 1}},
         {**fresh.fence(), "status": "Completed"}],
    )  # fmt: skip
    assert (late["status_code"], late["body"]["task_status"]) == (200, "Completed")
    assert other["status_code"] == 200
    assert get_task(dispatcher, lease.task_id)["result"] == {"late": 1}


def test_an_oversized_result_fails_only_its_own_completion(
    dispatcher: Dispatcher, db_url: str
) -> None:
    big, small = running(dispatcher), running(dispatcher)
    cap = dispatcher.settings.result_max_bytes
    results = complete_batch(
        dispatcher,
        [{**big.fence(), "status": "Completed", "result": {"x": "y" * cap}},
         {**small.fence(), "status": "Completed"}],
    )  # fmt: skip
    assert results[0]["status_code"] == 422
    assert results[0]["body"]["error"] == "validation_error"
    assert results[1]["status_code"] == 200
    assert task_row(db_url, big.task_id)["status"] == "Running"
    assert task_row(db_url, small.task_id)["status"] == "Completed"


@pytest.fixture
def refuses_poison_results(db_url: str) -> Iterator[None]:
    """A trigger that makes Postgres refuse (SQLSTATE 22023) any result holding `poison`: a
    completion the contracts accept but the database cannot store."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """
            CREATE FUNCTION test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.result ? 'poison' THEN
                    RAISE EXCEPTION 'poisoned result' USING ERRCODE = '22023';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse_poison BEFORE UPDATE ON tasks
                FOR EACH ROW EXECUTE FUNCTION test_refuse_poison();
            """
        )
    yield


def test_a_completion_that_cannot_be_stored_fails_alone(
    dispatcher: Dispatcher, db_url: str, refuses_poison_results: None
) -> None:
    leases = [running(dispatcher) for _ in range(3)]
    results = complete_batch(
        dispatcher,
        [{**leases[0].fence(), "status": "Completed", "events": [cursor_event(1)]},
         {**leases[1].fence(), "status": "Completed", "result": {"poison": 1}},
         {**leases[2].fence(), "status": "Failed", "error_message": "e"}],
    )  # fmt: skip
    assert [r["status_code"] for r in results] == [200, 422, 200]
    assert "cannot be stored" in results[1]["body"]["message"]
    assert task_row(db_url, leases[0].task_id)["status"] == "Completed"
    assert len(event_rows(db_url, leases[0].task_id)) == 1
    assert task_row(db_url, leases[1].task_id)["status"] == "Running"
    assert attempt_rows(db_url, leases[1].task_id)[0]["outcome"] is None
    assert task_row(db_url, leases[2].task_id)["status"] == "Failed"


def test_batch_bounds_are_enforced(dispatcher: Dispatcher) -> None:
    lease = running(dispatcher)
    body = {**lease.fence(), "status": "Completed"}
    for completions in ([], [body] * 11):
        response = dispatcher.worker.post(
            "/internal/task-complete-batch", json={"completions": completions}
        )
        assert response.status_code == 422, response.text
    assert task_row_status(dispatcher, lease.task_id) == "Running"


def task_row_status(dispatcher: Dispatcher, task_id: str) -> str:
    status: str = get_task(dispatcher, task_id)["status"]
    return status


def test_a_task_completed_twice_in_one_batch_is_applied_once(
    dispatcher: Dispatcher, db_url: str
) -> None:
    lease = running(dispatcher)
    body = {**lease.fence(), "status": "Completed", "events": [cursor_event(3)]}
    results = complete_batch(dispatcher, [body, body, {**body, "status": "Failed", "events": []}])
    answers = [
        (r["status_code"], r["body"].get("repeated"), r["body"].get("reason")) for r in results
    ]
    assert answers == [(200, False, None), (200, True, None), (409, None, "NotRunning")]
    assert len(attempt_rows(db_url, lease.task_id)) == 1
    assert len(event_rows(db_url, lease.task_id)) == 1
    assert task_row(db_url, lease.task_id)["status"] == "Completed"


# ---- completions and a claim-next in one call -------------------------------------------------


def complete_and_claim(
    dispatcher: Dispatcher, completions: list[JsonDict], queue: str, limit: int
) -> tuple[list[JsonDict], list[JsonDict]]:
    """One task-complete-batch call carrying a claim-next; (results, claimed)."""
    claim = {"worker_id": "w-combined", "queue": queue, "max": limit}
    response = dispatcher.worker.post(
        "/internal/task-complete-batch", json={"completions": completions, "claim_next": claim}
    )
    assert response.status_code == 200, response.text
    CompleteBatchResponse.model_validate_json(response.text)
    body = response.json()
    assert [r["task_id"] for r in body["results"]] == [c["task_id"] for c in completions]
    return body["results"], body["claimed"]


def test_a_batch_with_claim_next_completes_and_claims_in_one_transaction(
    dispatcher: Dispatcher, db_url: str
) -> None:
    done = [running(dispatcher, queue="q1") for _ in range(2)]
    queued = [create_task(dispatcher, queue="q2")["task_id"] for _ in range(3)]
    results, claimed_now = complete_and_claim(
        dispatcher, [{**lease.fence(), "status": "Completed"} for lease in done], "q2", 10
    )
    assert [(r["status_code"], r["body"]["task_status"]) for r in results] == [
        (200, "Completed")
    ] * 2
    assert [c["task"]["task_id"] for c in claimed_now] == queued  # oldest first
    for answer in claimed_now:
        ClaimedResponse.model_validate(answer)
        row = task_row(db_url, answer["task"]["task_id"])
        assert row is not None
        assert (row["status"], row["worker_id"]) == ("Running", "w-combined")
        assert str(row["lease_token"]) == answer["lease_token"]
    # One transaction, one commit: every row the call wrote carries the same transaction id.
    xmins = {task_xmin(db_url, task_id) for task_id in [d.task_id for d in done] + queued}
    assert len(xmins) == 1
    # The claimed attempt is the current one: its holder can complete it.
    lease = Lease(claimed_now[0]["task"]["task_id"], 1, claimed_now[0]["lease_token"])
    assert complete(dispatcher, lease).status_code == 200


def test_a_stale_completion_in_a_batch_with_claim_next_changes_nothing_and_the_claim_stands(
    dispatcher: Dispatcher, db_url: str
) -> None:
    ok, stale = running(dispatcher, queue="q1"), running(dispatcher, queue="q1")
    stale_before = task_state(db_url, stale.task_id)
    queued = create_task(dispatcher, queue="q2")["task_id"]
    results, claimed_now = complete_and_claim(
        dispatcher,
        [{**ok.fence(), "status": "Completed"},
         {**stale.fence(), "attempt": stale.attempt + 1, "status": "Completed"}],
        "q2",
        4,
    )  # fmt: skip
    assert results[0]["status_code"] == 200
    assert (results[1]["status_code"], results[1]["body"]["reason"]) == (409, "StaleAttempt")
    assert task_state(db_url, stale.task_id) == stale_before
    assert [c["task"]["task_id"] for c in claimed_now] == [queued]
    assert task_row_status(dispatcher, queued) == "Running"


def test_claim_next_in_a_batch_claims_at_most_max(dispatcher: Dispatcher, db_url: str) -> None:
    lease = running(dispatcher, queue="q1")
    queued = [create_task(dispatcher, queue="q3")["task_id"] for _ in range(5)]
    _, claimed_now = complete_and_claim(
        dispatcher, [{**lease.fence(), "status": "Completed"}], "q3", 2
    )
    assert [c["task"]["task_id"] for c in claimed_now] == queued[:2]
    assert [task_row_status(dispatcher, t) for t in queued] == ["Running"] * 2 + ["Queued"] * 3
    # A queue with nothing Queued: the completions go through, the claim is empty.
    other = running(dispatcher, queue="q1")
    results, none = complete_and_claim(
        dispatcher, [{**other.fence(), "status": "Completed"}], "alpha", 10
    )
    assert results[0]["status_code"] == 200 and none == []


def test_a_batch_refused_as_a_whole_claims_nothing(dispatcher: Dispatcher, db_url: str) -> None:
    lease = running(dispatcher, queue="q1")
    queued = create_task(dispatcher, queue="q2")["task_id"]
    before = task_state(db_url, lease.task_id), task_state(db_url, queued)
    good = {**lease.fence(), "status": "Completed"}
    claim = {"worker_id": "w", "queue": "q2", "max": 1}
    bodies = [
        {"completions": [good], "claim_next": {**claim, "wait_seconds": 1}},  # never waits
        {"completions": [good, {**good, "attempt": 0}], "claim_next": claim},
        {"completions": [], "claim_next": claim},
        {"completions": [good], "claim_next": {**claim, "max": 11}},
        {"completions": [good], "claim_next": {**claim, "queue": ""}},
    ]
    for body in bodies:
        response = dispatcher.worker.post("/internal/task-complete-batch", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["error"] == "validation_error", response.text
    assert (task_state(db_url, lease.task_id), task_state(db_url, queued)) == before


def test_a_batch_without_claim_next_answers_no_claimed_field(dispatcher: Dispatcher) -> None:
    """A wrapper that predates `claim_next` refuses unknown fields: it gets none."""
    lease = running(dispatcher)
    response = dispatcher.worker.post(
        "/internal/task-complete-batch",
        json={"completions": [{**lease.fence(), "status": "Completed"}]},
    )
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"results"}


def test_a_batch_retried_completion_by_completion_still_answers_its_claim(
    dispatcher: Dispatcher, db_url: str, refuses_poison_results: None
) -> None:
    ok, poisoned = running(dispatcher, queue="q1"), running(dispatcher, queue="q1")
    queued = [create_task(dispatcher, queue="q2")["task_id"] for _ in range(2)]
    results, claimed_now = complete_and_claim(
        dispatcher,
        [{**ok.fence(), "status": "Completed"},
         {**poisoned.fence(), "status": "Completed", "result": {"poison": 1}}],
        "q2",
        5,
    )  # fmt: skip
    assert [r["status_code"] for r in results] == [200, 422]
    assert task_row_status(dispatcher, poisoned.task_id) == "Running"
    # The claim ran in its own transaction after the retried completions; it is answered.
    assert sorted(c["task"]["task_id"] for c in claimed_now) == sorted(queued)
    assert [task_row_status(dispatcher, t) for t in queued] == ["Running"] * 2
