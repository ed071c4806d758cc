"""Priority: 0-9, lower first, default 5, on every way a task is created; claim-next takes the
tasks of a queue by priority, then oldest first (taskplat_claim_next, migration 0026), on each of
its paths (a claim-next, a waiting claim, the claim-next of a completion batch)."""

from __future__ import annotations

from typing import Any

from taskplat.testkit.dispatcher_calls import claimed, create_task, get_task
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import row_counts

JsonDict = dict[str, Any]

# (priority, label) in creation order; the clock moves between creations.
MIXED = [(5, "a"), (9, "b"), (0, "c"), (5, "d"), (3, "e"), (0, "f"), (9, "g")]
EXPECTED = ["c", "f", "e", "a", "d", "b", "g"]


def _create_mixed(d: Dispatcher, queue: str) -> dict[str, str]:
    """task_id -> label of the MIXED tasks, created one per clock tick."""
    labels = {}
    for priority, label in MIXED:
        labels[create_task(d, queue=queue, priority=priority)["task_id"]] = label
        d.clock.advance(1)
    return labels


def _claim_next(d: Dispatcher, queue: str, limit: int, **extra: Any) -> list[str]:
    body = {"worker_id": "w-1", "queue": queue, "max": limit, **extra}
    response = d.worker.post("/internal/task-claim-next", json=body)
    assert response.status_code == 200, response.text
    return [each["task"]["task_id"] for each in response.json()["claimed"]]


def test_priority_defaults_to_5_and_is_shown(dispatcher: Dispatcher) -> None:
    d = dispatcher
    plain = create_task(d)
    assert plain["priority"] == 5
    urgent = create_task(d, priority=0)
    assert urgent["priority"] == 0 and get_task(d, urgent["task_id"])["priority"] == 0
    response = d.api.post("/tasks/batch", json={"tasks": [{"operator": "echo", "priority": 9}]})
    assert response.status_code == 201, response.text
    (created,) = response.json()["results"]
    assert get_task(d, created["task"]["task_id"])["priority"] == 9


def test_a_priority_out_of_range_is_refused_and_changes_nothing(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    counts = row_counts(db_url)
    for bad in (10, -1, "high", 1.5, None):
        response = d.api.post("/tasks", json={"operator": "echo", "priority": bad})
        assert response.status_code == 422, (bad, response.text)
        assert "priority" in response.text
        batch = {"tasks": [{"operator": "echo"}, {"operator": "echo", "priority": bad}]}
        assert d.api.post("/tasks/batch", json=batch).status_code == 422
    dag = {"jobs": {"j": {"operator": "echo", "priority": 10}}}
    assert d.api.put("/dags/prio", json=dag).status_code == 422
    assert row_counts(db_url) == counts


def test_claim_next_takes_lower_priority_first_then_oldest(dispatcher: Dispatcher) -> None:
    d = dispatcher
    labels = _create_mixed(d, "q1")
    assert [labels[t] for t in _claim_next(d, "q1", 10)] == EXPECTED
    labels = _create_mixed(d, "q2")
    one_by_one = [labels[t] for _ in MIXED for t in _claim_next(d, "q2", 1)]
    assert one_by_one == EXPECTED
    labels = _create_mixed(d, "q3")
    waited = _claim_next(d, "q3", 3, wait_seconds=1)
    assert [labels[t] for t in waited] == EXPECTED[:3]


def test_a_completion_batch_claims_next_by_priority(dispatcher: Dispatcher) -> None:
    d = dispatcher
    running = claimed(d, create_task(d, queue="a")["task_id"])
    labels = _create_mixed(d, "a")
    body = {
        "completions": [{**running.fence(), "status": "Completed"}],
        "claim_next": {"worker_id": "worker-1", "queue": "a", "max": 2},
    }
    response = d.worker.post("/internal/task-complete-batch", json=body)
    assert response.status_code == 200, response.text
    taken = [each["task"]["task_id"] for each in response.json()["claimed"]]
    assert [labels[t] for t in taken] == EXPECTED[:2]


def test_a_job_gives_its_runs_its_priority(dispatcher: Dispatcher) -> None:
    d = dispatcher
    dag = {
        "jobs": {
            "urgent": {"operator": "echo", "queue": "b", "priority": 1},
            "plain": {"operator": "echo", "queue": "b"},
        }
    }
    response = d.api.put("/dags/prio", json=dag)
    assert response.status_code in (200, 201), response.text
    plain = d.api.post("/dags/prio/jobs/plain/runs", json={})
    assert plain.status_code == 201, plain.text
    assert plain.json()["priority"] == 5
    d.clock.advance(1)
    urgent = d.api.post("/dags/prio/jobs/urgent/runs", json={})
    assert urgent.status_code == 201, urgent.text
    assert urgent.json()["priority"] == 1
    assert _claim_next(d, "b", 1) == [urgent.json()["task_id"]]
