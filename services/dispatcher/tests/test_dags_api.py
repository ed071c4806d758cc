"""The DAG and dataset routes against a real Postgres: apply (JSON and YAML, idempotent, replace,
refused whole), views with resolved dataset uuids, runs, claim payloads with resolved outputs,
listing by job, version rollover cancelling pinned tasks, events with their routing state."""

from __future__ import annotations

from typing import Any

import yaml

from taskplat.testkit.dispatcher_calls import claimed, create_task, emit_events, get_task, heartbeat
from taskplat.testkit.dispatcher_harness import Dispatcher
from taskplat.testkit.dispatcher_rows import row_counts

PIPELINE: dict[str, Any] = {
    "jobs": {
        "source": {"operator": "emit", "queue": "default", "config": {"chain": "monad"},
                   "outputs": [{"index": 0, "dataset": "blocks"},
                               {"index": 1, "dataset": "blobs", "kind": "s3"}]},
        "transform": {"operator": "emit", "max_attempts": 7,
                      "inputs": [{"from": {"job": "source", "output_index": 0}}],
                      "outputs": [{"index": 0, "dataset": "enriched"}]},
        "alerts": {"operator": "echo", "schedule": "*/5 * * * *",
                   "inputs": [{"from": {"dataset": "enriched"}, "where": "severity > 2"}]},
    }
}  # fmt: skip


def apply(d: Dispatcher, name: str, doc: dict[str, Any], status: int) -> dict[str, Any]:
    response = d.api.put(f"/dags/{name}", json=doc)
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


def datasets(d: Dispatcher) -> dict[str, dict[str, Any]]:
    return {each["name"]: each for each in d.api.get("/datasets").json()["datasets"]}


def test_apply_is_idempotent_and_the_view_resolves_datasets(dispatcher: Dispatcher) -> None:
    d = dispatcher
    created = apply(d, "monad", PIPELINE, 201)
    assert created["changed"] is True
    again = apply(d, "monad", PIPELINE, 200)
    assert again["changed"] is False and again["document_hash"] == created["document_hash"]
    as_yaml = d.api.put(
        "/dags/monad",
        content=yaml.safe_dump(PIPELINE).encode(),
        headers={"Content-Type": "application/yaml"},
    )
    assert as_yaml.status_code == 200 and as_yaml.json()["changed"] is False, as_yaml.text

    known = datasets(d)
    assert {name: each["kind"] for name, each in known.items()} == {
        "blobs": "s3", "blocks": "postgres", "enriched": "postgres",
    }  # fmt: skip
    view = d.api.get("/dags/monad").json()
    jobs = {job["name"]: job for job in view["jobs"]}
    assert jobs["transform"]["inputs"] == [
        {"from": {"job": "source", "output_index": 0}, "where": None, "dataset": "blocks",
         "dataset_uuid": known["blocks"]["dataset_uuid"]},
    ]  # fmt: skip
    assert jobs["transform"]["max_attempts"] == 7
    assert jobs["alerts"]["inputs"][0]["where"] == "severity > 2"
    assert jobs["alerts"]["schedule_next_at"] is not None
    assert jobs["source"]["outputs"][1] == {
        "index": 1, "dataset": "blobs", "dataset_uuid": known["blobs"]["dataset_uuid"],
        "kind": "s3",
    }  # fmt: skip
    assert d.api.get("/dags").json()["dags"][0]["jobs"] == 3


def test_a_new_document_replaces_the_jobs_and_keeps_the_datasets(dispatcher: Dispatcher) -> None:
    d = dispatcher
    apply(d, "monad", PIPELINE, 201)
    smaller = {"jobs": {"only": {"operator": "echo", "outputs": [{"index": 0, "dataset": "x"}]}}}
    replaced = apply(d, "monad", smaller, 200)
    assert replaced["changed"] is True
    assert [job["name"] for job in replaced["jobs"]] == ["only"]
    assert set(datasets(d)) == {"blobs", "blocks", "enriched", "x"}
    assert d.api.delete("/dags/monad").json() == {"dag_name": "monad", "deleted": True}
    assert d.api.get("/dags/monad").status_code == 404
    assert set(datasets(d)) == {"blobs", "blocks", "enriched", "x"}


def test_a_refused_document_stores_nothing(dispatcher: Dispatcher, db_url: str) -> None:
    d = dispatcher
    apply(d, "monad", PIPELINE, 201)
    before = d.api.get("/dags/monad").json()
    counts = row_counts(db_url)
    cyclic = {"jobs": {"a": {"operator": "x", "inputs": [{"from": {"job": "a", "output_index": 0}}],
                             "outputs": [{"index": 0, "dataset": "loop"}]}}}  # fmt: skip
    response = d.api.put("/dags/monad", json=cyclic)
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == "the jobs form a cycle: a -> a"
    # A dataset of another kind than the one it was created with.
    clash = {"jobs": {"b": {"operator": "x", "outputs": [{"index": 0, "dataset": "blobs"}]}}}
    response = d.api.put("/dags/other", json=clash)
    assert response.status_code == 422 and "exists with kind 's3'" in response.text
    assert d.api.put("/dags/bad%20name", json=PIPELINE).status_code == 422
    assert d.api.get("/dags/monad").json() == before
    assert d.api.get("/dags/other").status_code == 404
    assert row_counts(db_url) == counts
    assert "loop" not in datasets(d)


def test_a_run_carries_its_job_and_a_claim_resolves_its_outputs(dispatcher: Dispatcher) -> None:
    d = dispatcher
    apply(d, "monad", PIPELINE, 201)
    response = d.api.post("/dags/monad/jobs/source/runs", json={"config": {"from": 7}})
    assert response.status_code == 201, response.text
    task = response.json()
    assert task["job"] == {"dag_name": "monad", "name": "source"}
    assert task["config"] == {"chain": "monad", "from": 7}
    assert task["status"] == "Queued" and task["operator"] == "emit"
    known = datasets(d)
    claim = d.worker.post(
        "/internal/task-claim", json={"task_id": task["task_id"], "worker_id": "w"}
    ).json()
    blocks, blobs = known["blocks"], known["blobs"]
    assert claim["task"]["outputs"] == [
        {"output_index": 0, "dataset_uuid": blocks["dataset_uuid"],
         "dataset_version": blocks["current_version"],
         "location": f"postgres_table:dataset_{blocks['dataset_uuid']}",
         "dataset": "blocks", "kind": "postgres", "schema_hash": None,
         "buffer_queue_url": None},
        {"output_index": 1, "dataset_uuid": blobs["dataset_uuid"],
         "dataset_version": blobs["current_version"],
         "location": f"s3://taskplat-datasets/dataset/{blobs['dataset_uuid']}/version/"
                     f"{blobs['current_version']}/",
         "dataset": "blobs", "kind": "s3", "schema_hash": None, "buffer_queue_url": None},
    ]  # fmt: skip
    fetched = d.worker.get("/internal/task-fetch", params={"task_id": task["task_id"]}).json()
    assert fetched["task"]["outputs"] == claim["task"]["outputs"]

    keyed = {"idempotency_key": "run-1"}
    first = d.api.post("/dags/monad/jobs/transform/runs", json=keyed)
    second = d.api.post("/dags/monad/jobs/transform/runs", json=keyed)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["task_id"] == second.json()["task_id"]
    assert d.api.post("/dags/monad/jobs/ghost/runs", json={}).status_code == 404
    create_task(d)  # a task of no job
    listed = d.api.get("/tasks", params={"dag": "monad", "job": "transform"}).json()["tasks"]
    assert [each["task_id"] for each in listed] == [first.json()["task_id"]]
    assert len(d.api.get("/tasks", params={"dag": "monad"}).json()["tasks"]) == 2


def test_a_rollover_cancels_the_tasks_pinned_to_an_older_version(dispatcher: Dispatcher) -> None:
    d = dispatcher
    apply(d, "monad", PIPELINE, 201)
    blocks = datasets(d)["blocks"]
    old = blocks["current_version"]
    pin = {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": old, "cursor": 5}
    queued = d.api.post("/dags/monad/jobs/transform/runs", json={"inputs": [pin]}).json()
    running = d.api.post("/dags/monad/jobs/transform/runs", json={"inputs": [pin]}).json()
    lease = claimed(d, running["task_id"])
    unpinned = d.api.post("/dags/monad/jobs/transform/runs", json={}).json()

    response = d.api.post(f"/datasets/{blocks['dataset_uuid']}/versions", json={})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["canceled_tasks"] == 2
    new = body["dataset"]["current_version"]
    assert new != old
    assert [(v["dataset_version"], v["current"]) for v in body["dataset"]["versions"]] == [
        (new, True), (old, False),
    ]  # fmt: skip
    for task_id in (queued["task_id"], running["task_id"]):
        view = get_task(d, task_id)
        assert (view["status"], view["cancel_reason"]) == ("Canceled", "VersionSuperseded")
    assert get_task(d, unpinned["task_id"])["status"] == "Queued"
    refused = heartbeat(d, lease)
    assert refused.status_code == 409 and refused.json()["reason"] == "Canceled"


def test_events_are_listed_with_their_producer_and_routing_state(dispatcher: Dispatcher) -> None:
    d = dispatcher
    apply(d, "monad", PIPELINE, 201)
    blocks = datasets(d)["blocks"]
    run = d.api.post("/dags/monad/jobs/source/runs", json={}).json()
    lease = claimed(d, run["task_id"])
    version = blocks["current_version"]
    events = [
        {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": version, "cursor": 10},
        {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": version, "cursor": 12},
    ]
    assert emit_events(d, lease, events).json()["accepted"] == 2
    assert emit_events(d, lease, events).json()["accepted"] == 0
    no_position = {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": version}
    assert emit_events(d, lease, [no_position]).status_code == 422
    page = d.api.get(f"/datasets/{blocks['dataset_uuid']}/events", params={"limit": 1}).json()
    assert len(page["events"]) == 1 and page["next_cursor"]
    event = page["events"][0]
    assert event["cursor"] == 12 and event["routed"] is False and event["reason"] == "Pending"
    assert event["producer"] == {"task_id": run["task_id"], "attempt": 1}
    rest = d.api.get(
        f"/datasets/{blocks['dataset_uuid']}/events",
        params={"cursor": page["next_cursor"], "dataset_version": version},
    ).json()
    assert [each["cursor"] for each in rest["events"]] == [10] and rest["next_cursor"] is None
    assert d.api.get(f"/datasets/{blocks['dataset_uuid']}").json()["latest_cursor"] == 12
    bad = d.api.get(f"/datasets/{blocks['dataset_uuid']}/events", params={"cursor": "zz"})
    assert bad.status_code == 422
    emitted = d.api.get(f"/tasks/{run['task_id']}/events").json()
    assert [each["cursor"] for each in emitted["events"]] == [12, 10]
    assert emitted["events"][0]["producer"] == {"task_id": run["task_id"], "attempt": 1}
