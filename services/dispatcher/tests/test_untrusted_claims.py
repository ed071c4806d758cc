"""No untrusted task is handed out without its capability token.

Untrusted work (a job that says `trust: untrusted`, an operator of the `untrusted_operators`
setting) is created while the dispatcher has capability keys; the keys are then removed and the
dispatcher restarted (a second dispatcher on the same database, without them). On every claim
path of the dispatcher (by id, batch, claim-next, waiting claim, the claim of a completion batch,
the claim of a create for a waiting claim) such a task is not taken: the answer names the missing
setting where the path answers per task, the task row and its history stay exactly as they were
(Queued, no attempt spent, nothing written), `taskplat.claims.refused` counts each refusal and
`/readyz` says untrusted work is not served while staying ready. Trusted work is served as before.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from taskplat.common.tokens.keys import private_key_pem
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.dispatcher_calls import claimed, create_task
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.dispatcher_rows import task_state, task_xmin

CAP_KEY = private_key_pem(b"\x21" * 32)
SETTING = "TASKPLAT_CAPABILITY_TOKEN_KEYS"
DAG = {"jobs": {"udf": {"operator": "sandboxed", "trust": "untrusted"}}}
REFUSED = f'taskplat_claims_refused_total{{setting="{SETTING}"}}'


@pytest.fixture
def untrusted_work(db_url: str) -> dict[str, str]:
    """An untrusted job's run and an untrusted operator's task, created with capability keys."""
    with serve_dispatcher(
        db_url,
        untrusted_operators="udf",
        capability_token_keys=json.dumps({"c1": CAP_KEY}),
        capability_token_active_kid="c1",
    ) as keyed:
        assert keyed.api.put("/dags/lake", json=DAG).status_code == 201
        run = keyed.api.post("/dags/lake/jobs/udf/runs", json={})
        assert run.status_code == 201, run.text
        by_operator = create_task(keyed, operator="udf")
        return {"job": run.json()["task_id"], "operator": by_operator["task_id"]}


@pytest.fixture
def keyless(db_url: str) -> Iterator[Dispatcher]:
    """The dispatcher restarted without its capability keys (the same untrusted operators)."""
    with serve_dispatcher(db_url, untrusted_operators="udf") as served:
        yield served


def _states(db_url: str, work: dict[str, str]) -> dict[str, Any]:
    return {
        name: (task_state(db_url, task_id), task_xmin(db_url, task_id))
        for name, task_id in work.items()
    }


def _refused(dispatcher: Dispatcher) -> float:
    assert dispatcher.telemetry is not None
    for line in dispatcher.telemetry.prometheus_text().decode().splitlines():
        if line.startswith(REFUSED + " "):
            return float(line.split()[-1])
    return 0.0


def _assert_unchanged(db_url: str, work: dict[str, str], before: dict[str, Any]) -> None:
    after = _states(db_url, work)
    assert after == before
    for state, _ in after.values():
        assert state["task"]["status"] == "Queued" and state["task"]["attempt"] == 1
        assert state["attempts"] == []


def _claim_next(dispatcher: Dispatcher, wait_seconds: float = 0.0) -> dict[str, Any]:
    body = {"worker_id": "w-1", "queue": "default", "max": 10, "wait_seconds": wait_seconds}
    response = dispatcher.worker.post("/internal/task-claim-next", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_claim_by_id_or_in_a_batch_answers_not_claimed_naming_the_setting(
    db_url: str, untrusted_work: dict[str, str], keyless: Dispatcher
) -> None:
    before = _states(db_url, untrusted_work)
    for task_id in untrusted_work.values():
        response = keyless.worker.post(
            "/internal/task-claim", json={"task_id": task_id, "worker_id": "w-1"}
        )
        assert response.status_code == 200
        body = response.json()
        assert (body["status"], body["reason"]) == ("NotClaimed", "MissingCapabilityKeys")
        assert SETTING in body["detail"]
    response = keyless.worker.post(
        "/internal/task-claim-batch",
        json={"worker_id": "w-1", "task_ids": list(untrusted_work.values())},
    )
    body = response.json()
    assert body["claimed"] == []
    assert [(item["task_id"], item["reason"]) for item in body["not_claimed"]] == [
        (task_id, "MissingCapabilityKeys") for task_id in untrusted_work.values()
    ]
    assert all(SETTING in item["detail"] for item in body["not_claimed"])
    _assert_unchanged(db_url, untrusted_work, before)
    assert _refused(keyless) == 4
    # Other reasons carry no detail, as before.
    missing = keyless.worker.post(
        "/internal/task-claim",
        json={"task_id": "00000000-0000-4000-8000-000000000000", "worker_id": "w-1"},
    )
    assert missing.json() == {"status": "NotClaimed", "reason": "NotFound"}


def test_claim_next_takes_the_trusted_task_and_names_the_untrusted_ones(
    db_url: str, untrusted_work: dict[str, str], keyless: Dispatcher
) -> None:
    before = _states(db_url, untrusted_work)
    trusted = create_task(keyless)["task_id"]
    body = _claim_next(keyless)
    assert [each["task"]["task_id"] for each in body["claimed"]] == [trusted]
    assert sorted(item["task_id"] for item in body["not_claimed"]) == sorted(
        untrusted_work.values()
    )
    assert {item["reason"] for item in body["not_claimed"]} == {"MissingCapabilityKeys"}
    _assert_unchanged(db_url, untrusted_work, before)
    assert _refused(keyless) == 2
    # Nothing claimable left: the answer is empty but says why.
    again = _claim_next(keyless)
    assert again["claimed"] == [] and len(again["not_claimed"]) == 2


def test_a_waiting_claim_takes_a_trusted_create_and_never_an_untrusted_task(
    db_url: str, untrusted_work: dict[str, str], keyless: Dispatcher
) -> None:
    before = _states(db_url, untrusted_work)
    answers: list[dict[str, Any]] = []
    waiting = threading.Thread(target=lambda: answers.append(_claim_next(keyless, 5.0)))
    waiting.start()
    # A create on the same dispatcher claims for the waiting claim in its own transaction; the
    # untrusted tasks, Queued before, were never taken by the waiting claim's first claim.
    trusted = _create_when_waiting(keyless)
    waiting.join(timeout=30)
    assert not waiting.is_alive()
    [body] = answers
    assert [each["task"]["task_id"] for each in body["claimed"]] == [trusted]
    # The create read what its claim left in the same transaction: the answer names it.
    assert sorted(item["task_id"] for item in body["not_claimed"]) == sorted(
        untrusted_work.values()
    )
    _assert_unchanged(db_url, untrusted_work, before)


def test_a_waiting_claim_that_finds_only_untrusted_work_answers_why(
    db_url: str, untrusted_work: dict[str, str], keyless: Dispatcher
) -> None:
    before = _states(db_url, untrusted_work)
    body = _claim_next(keyless, 0.5)
    assert body["claimed"] == []
    assert sorted(item["task_id"] for item in body["not_claimed"]) == sorted(
        untrusted_work.values()
    )
    _assert_unchanged(db_url, untrusted_work, before)


def test_the_claim_of_a_completion_batch_takes_no_untrusted_task(
    db_url: str, untrusted_work: dict[str, str], keyless: Dispatcher
) -> None:
    lease = claimed(keyless, create_task(keyless)["task_id"], "w-1")
    before = _states(db_url, untrusted_work)
    completion = {**lease.fence(), "status": "Completed"}
    response = keyless.worker.post(
        "/internal/task-complete-batch",
        json={
            "completions": [completion],
            "claim_next": {"worker_id": "w-1", "queue": "default", "max": 10},
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["results"][0]["status_code"] == 200 and body["claimed"] == []
    _assert_unchanged(db_url, untrusted_work, before)
    assert _refused(keyless) == 2  # counted, though this answer has no place to name them


def test_readyz_says_untrusted_work_is_not_served_and_stays_ready(
    db_url: str, keyless: Dispatcher
) -> None:
    response = keyless.anonymous.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready"
    assert body["untrusted"]["ready"] is False and body["untrusted"]["setting"] == SETTING
    assert SETTING in body["untrusted"]["reason"]
    with serve_dispatcher(
        db_url, capability_token_keys=json.dumps({"c1": CAP_KEY}), capability_token_active_kid="c1"
    ) as keyed:
        assert keyed.anonymous.get("/readyz").json() == {
            "status": "ready",
            "untrusted": {"ready": True},
        }


def test_with_capability_keys_the_same_work_is_claimed_with_its_token(
    db_url: str, untrusted_work: dict[str, str]
) -> None:
    with serve_dispatcher(
        db_url,
        untrusted_operators="udf",
        capability_token_keys=json.dumps({"c1": CAP_KEY}),
        capability_token_active_kid="c1",
    ) as keyed:
        body = _claim_next(keyed)
        assert sorted(each["task"]["task_id"] for each in body["claimed"]) == sorted(
            untrusted_work.values()
        )
        assert all(each["capability_token"] for each in body["claimed"])
        assert "not_claimed" not in body


def _create_when_waiting(dispatcher: Dispatcher) -> str:
    """Create a trusted task once a claim waits on the queue (`taskplat_claims_waiting`)."""

    def waiting() -> bool:
        text = dispatcher.anonymous.get("/metrics").text
        return any(
            line.startswith("taskplat_claims_waiting{")
            and 'queue="default"' in line
            and float(line.rsplit(" ", 1)[1]) >= 1
            for line in text.splitlines()
        )

    wait_for(waiting, timeout=15, what="the claim to wait")
    created: str = create_task(dispatcher)["task_id"]
    return created
