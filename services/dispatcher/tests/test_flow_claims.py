"""Flow control through the dispatcher's claims: `concurrency_key` is taken on every way a task
is created, and a claim a queue limit holds back answers NotClaimed with its reason and
`retry_after_ms`, counted in `taskplat_claims_limited_total` (docs/flow-control.md)."""

from __future__ import annotations

from typing import Any

from taskplat.testkit.dispatcher_calls import claim, create_task, get_task
from taskplat.testkit.dispatcher_harness import Dispatcher

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
    assert _queue(d, "paced")["limits_use"]["tokens_left"] == 0
    metrics = d.api.get("/metrics").text
    assert 'taskplat_claims_limited_total{queue="tight",reason="ConcurrencyLimited"}' in metrics
    assert 'taskplat_queue_running{queue="tight"} 1.0' in metrics
