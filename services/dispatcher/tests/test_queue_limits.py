"""Queue limits through the dispatcher: `PUT /queues/{queue}` sets them (admin, audited, 422 on
bad input changing nothing), `GET /queues` shows them with their use, `concurrency_key` is taken
on every way a task is created, and a claim held back answers NotClaimed with its reason and
`retry_after_ms` (docs/flow-control.md)."""

from __future__ import annotations

from typing import Any

import pytest
from test_access import client, new_key
from test_audit_workers import audit_rows

from taskplat.testkit.dispatcher_calls import claim, create_task, get_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import row_counts

JsonDict = dict[str, Any]


def _put(d: Dispatcher, queue: str, body: JsonDict | None) -> JsonDict:
    response = (
        d.api.put(f"/queues/{queue}", json=body)
        if body is not None
        else d.api.put(f"/queues/{queue}")
    )
    assert response.status_code in (200, 201), response.text
    view: JsonDict = response.json()
    return view


def _queue(d: Dispatcher, queue: str) -> JsonDict:
    response = d.api.get(f"/queues/{queue}")
    assert response.status_code == 200, response.text
    view: JsonDict = response.json()
    return view


def test_limits_are_set_shown_replaced_and_cleared(dispatcher: Dispatcher, db_url: str) -> None:
    d = dispatcher
    fresh = _put(d, "limited", None)
    assert fresh["concurrency_limit"] is None and fresh["rate_limit"] is None
    assert fresh["keys_at_limit"] == 0 and fresh["tokens_left"] is None
    body = {"concurrency_limit": 3, "key_concurrency_limit": 1,
            "rate_limit": {"per_second": 10, "burst": 4}}  # fmt: skip
    view = _put(d, "limited", body)
    assert view["concurrency_limit"] == 3 and view["key_concurrency_limit"] == 1
    assert view["rate_limit"] == {"per_second": 10.0, "burst": 4} and view["tokens_left"] == 4
    listed = {q["name"]: q for q in d.api.get("/queues").json()["queues"]}
    assert listed["limited"]["concurrency_limit"] == 3
    # A PUT without a body keeps them; a body replaces all of them.
    assert _put(d, "limited", None)["concurrency_limit"] == 3
    replaced = _put(d, "limited", {"rate_limit": {"per_second": 2.5, "burst": 1}})
    assert replaced["concurrency_limit"] is None and replaced["rate_limit"]["per_second"] == 2.5
    cleared = _put(d, "limited", {})
    assert cleared["rate_limit"] is None and cleared["tokens_left"] is None
    outcomes = [r["outcome"] for r in audit_rows(db_url) if r["action"] == "register_queue"]
    assert outcomes == ["registered", "limits set", "already registered", "limits set",
                        "limits set"]  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        {"concurrency_limit": 0},
        {"concurrency_limit": -1},
        {"key_concurrency_limit": 0},
        {"rate_limit": {"per_second": 0, "burst": 1}},
        {"rate_limit": {"per_second": 1, "burst": 0}},
        {"rate_limit": {"per_second": 1}},
        {"concurrency_limit": 2, "unknown": 1},
        {"concurrency_limit": "three"},
        {"concurrency_limit": 10_000_000},
    ],
)
def test_bad_limits_answer_422_and_change_nothing(
    dispatcher: Dispatcher, db_url: str, body: JsonDict
) -> None:
    d = dispatcher
    _put(d, "guarded", {"concurrency_limit": 5})
    counts = row_counts(db_url)
    response = d.api.put("/queues/guarded", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] and response.json()["detail"]
    assert _queue(d, "guarded")["concurrency_limit"] == 5
    assert row_counts(db_url) == counts


def test_only_admin_sets_limits(dispatcher: Dispatcher) -> None:
    d = dispatcher
    operator = new_key(d, "operator", "read", "operate")
    with client(d, operator) as c:
        assert c.put("/queues/x", json={"concurrency_limit": 1}).status_code == 403


def test_concurrency_keys_are_taken_checked_and_shown(dispatcher: Dispatcher) -> None:
    d = dispatcher
    task = create_task(d, concurrency_key="customer-42")
    assert task["concurrency_key"] == "customer-42"
    assert get_task(d, task["task_id"])["concurrency_key"] == "customer-42"
    batch = {"tasks": [{"operator": "echo", "concurrency_key": "c-1"}, {"operator": "echo"}]}
    response = d.api.post("/tasks/batch", json=batch)
    assert response.status_code == 201, response.text
    keys = [each["task"]["concurrency_key"] for each in response.json()["results"]]
    assert keys == ["c-1", None]
    for bad in ("", "x" * 201, "tab\there", 7):
        response = d.api.post("/tasks", json={"operator": "echo", "concurrency_key": bad})
        assert response.status_code == 422, (bad, response.text)
    dag = {"jobs": {"j": {"operator": "echo", "concurrency_key": "store-7"}}}
    assert d.api.put("/dags/keyed", json=dag).status_code == 201
    run = d.api.post("/dags/keyed/jobs/j/runs", json={})
    assert run.status_code == 201, run.text
    assert get_task(d, run.json()["task_id"])["concurrency_key"] == "store-7"


def test_a_claim_over_a_limit_answers_its_reason_and_when_to_try_again(
    dispatcher: Dispatcher,
) -> None:
    d = dispatcher
    _put(d, "tight", {"concurrency_limit": 1})
    first = create_task(d, queue="tight")["task_id"]
    second = create_task(d, queue="tight")["task_id"]
    assert claim(d, first).json()["status"] == "Claimed"
    answer = claim(d, second).json()
    assert answer["status"] == "NotClaimed" and answer["reason"] == "ConcurrencyLimited"
    assert answer["retry_after_ms"] > 0
    assert get_task(d, second)["status"] == "Queued" and get_task(d, second)["attempts"] == []
    batch = d.worker.post(
        "/internal/task-claim-batch", json={"worker_id": "w-1", "task_ids": [second]}
    ).json()
    [item] = batch["not_claimed"]
    assert item["reason"] == "ConcurrencyLimited" and item["retry_after_ms"] > 0
    _put(d, "paced", {"rate_limit": {"per_second": 0.5, "burst": 1}})
    paced = [create_task(d, queue="paced")["task_id"] for _ in range(2)]
    first_paced = claim(d, paced[0])
    assert first_paced.json()["status"] == "Claimed", first_paced.text
    answer = claim(d, paced[1]).json()
    assert answer["status"] == "NotClaimed", answer
    assert answer["reason"] == "RateLimited" and 1000 < answer["retry_after_ms"] <= 2000
    assert _queue(d, "paced")["tokens_left"] == 0
    metrics = d.api.get("/metrics").text
    assert 'taskplat_claims_limited_total{queue="tight",reason="ConcurrencyLimited"}' in metrics
    assert 'taskplat_queue_running{queue="tight"} 1.0' in metrics
