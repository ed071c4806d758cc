"""The audit log: every operate and admin call writes one row in its own transaction (a failed
call writes none, and an audit row that cannot be written undoes the call; a refused one is
recorded on its own, test_route_guard.py); `GET /audit` needs admin, filters and pages.
The workers: a wrapper's report on claim-next or heartbeat lists it under `GET /workers`; a
silent one turns `lost`; an attempt token cannot report for a worker."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
from test_access import client, new_key

from taskplat.testkit.dispatcher_calls import claim, claimed, complete, create_task
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher


@pytest.fixture
def dispatcher_overrides() -> dict[str, object]:
    return {"worker_report_seconds": 0, "worker_lost_seconds": 30}


def audit_rows(db_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url) as conn:
        cursor = conn.execute(
            "SELECT key_name, action, target, outcome FROM audit_log ORDER BY audit_id"
        )
        names = [column.name for column in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def test_operate_and_admin_calls_are_audited_and_failed_ones_are_not(
    dispatcher: Dispatcher, db_url: str
) -> None:
    ops = new_key(dispatcher, "ops", "operate", "submit", "read")
    with client(dispatcher, ops) as c:
        queued = c.post("/tasks", json={"operator": "echo"}).json()["task_id"]
        done = c.post("/tasks", json={"operator": "echo"}).json()["task_id"]
        complete(dispatcher, claimed(dispatcher, done))
        before = audit_rows(db_url)
        assert [row["action"] for row in before] == ["create_key"]  # submit is not audited
        assert c.put(f"/tasks/{queued}/cancel").status_code == 200
        assert c.put(f"/tasks/{done}/cancel").status_code == 409
        assert c.put("/queues/ghost/pause").status_code == 404
        assert c.put("/queues/default/pause").status_code == 200
        assert c.put("/queues/default/pause").status_code == 200
        assert c.post(f"/tasks/{queued}/retry").status_code == 200
        assert c.put("/queues/fresh").status_code == 403
    assert dispatcher.api.put("/queues/fresh").status_code == 201
    assert audit_rows(db_url)[1:] == [
        {"key_name": "ops", "action": "cancel_task", "target": queued, "outcome": "canceled"},
        {"key_name": "ops", "action": "pause_queue", "target": "default", "outcome": "paused"},
        {"key_name": "ops", "action": "pause_queue", "target": "default",
         "outcome": "already paused"},
        {"key_name": "ops", "action": "retry_task", "target": queued, "outcome": "replayed"},
        # Refused (the key lacks `admin`): recorded on its own, nothing changed.
        {"key_name": "ops", "action": "register_queue", "target": "fresh",
         "outcome": "refused 403"},
        {"key_name": "bootstrap", "action": "register_queue", "target": "fresh",
         "outcome": "registered"},
    ]  # fmt: skip


def test_an_audit_row_that_cannot_be_written_undoes_the_call(
    dispatcher: Dispatcher, db_url: str
) -> None:
    task_id = create_task(dispatcher)["task_id"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'audit refused'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    # uvicorn closes the connection after a 500: one connection per call.
    for path in (f"/tasks/{task_id}/cancel", "/queues/default/pause"):
        with httpx.Client(
            base_url=dispatcher.base_url, headers=dispatcher.api.headers, timeout=30
        ) as once:
            assert once.put(path).status_code == 500
    assert dispatcher.api.get(f"/tasks/{task_id}").json()["status"] == "Queued"
    queues = {q["name"]: q for q in dispatcher.api.get("/queues").json()["queues"]}
    assert queues["default"]["paused"] is False
    assert audit_rows(db_url) == []


def test_the_audit_log_filters_and_pages(dispatcher: Dispatcher) -> None:
    ops = new_key(dispatcher, "ops", "operate")
    viewer = new_key(dispatcher, "viewer", "admin")
    start = dispatcher.clock.now()
    with client(dispatcher, ops) as c:
        for queue in ("a", "b", "c"):
            dispatcher.clock.advance(60)
            assert c.put(f"/queues/{queue}/pause").status_code == 200
    with client(dispatcher, viewer) as v:
        page = v.get("/audit", params={"key": "ops", "limit": 2}).json()
        assert [e["target"] for e in page["entries"]] == ["c", "b"]
        older = v.get("/audit", params={"key": "ops", "limit": 2, "cursor": page["next_cursor"]})
        assert [e["target"] for e in older.json()["entries"]] == ["a"]
        assert older.json()["next_cursor"] is None
        created = v.get("/audit", params={"action": "create_key"}).json()["entries"]
        assert {e["target"] for e in created} == {"ops", "viewer"}
        # Reading the log is an admin call: it is in the log too.
        reads = v.get("/audit", params={"action": "list_audit", "key": "viewer"}).json()
        assert [e["outcome"] for e in reads["entries"]][-1] == "listed 2"
        assert {e["key_name"] for e in created} == {"bootstrap"}
        since = (start.timestamp() + 90) if start else 0
        recent = v.get("/audit", params={"since": _iso(since), "action": "pause_queue"}).json()[
            "entries"
        ]
        assert [e["target"] for e in recent] == ["c", "b"]
        assert v.get("/audit", params={"since": "yesterday"}).status_code == 422
        assert v.get("/audit", params={"actions": "x"}).status_code == 422  # not a parameter


def _iso(timestamp: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def _report(worker_id: str, running: list[str]) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "queues": ["default", "a"],
        "slots": 4,
        "version": "1.2.3",
        "running": running,
    }


def test_workers_appear_from_their_reports_and_go_lost(dispatcher: Dispatcher) -> None:
    lease = claimed(dispatcher, create_task(dispatcher)["task_id"], worker_id="w-1")
    body = {"worker_id": "w-1", "queue": "default", "max": 1, "worker": _report("w-1", [])}
    assert dispatcher.worker.post("/internal/task-claim-next", json=body).status_code == 200
    heartbeat = {**lease.fence(), "worker": _report("w-1", [lease.task_id])}
    assert dispatcher.worker.post("/internal/heartbeat", json=heartbeat).status_code == 200
    listed = dispatcher.api.get("/workers").json()
    (worker,) = listed["workers"]
    assert worker["worker_id"] == "w-1" and worker["state"] == "alive"
    assert worker["running"] == [lease.task_id] and worker["queues"] == ["default", "a"]
    assert worker["slots"] == 4 and worker["version"] == "1.2.3"
    assert listed["lost_after_seconds"] == 30
    dispatcher.clock.advance(31)
    (worker,) = dispatcher.api.get("/workers").json()["workers"]
    assert worker["state"] == "lost" and worker["seconds_since_seen"] >= 30
    # An older wrapper that sends no report is served as before.
    plain = {"worker_id": "w-2", "queue": "default", "max": 1}
    assert dispatcher.worker.post("/internal/task-claim-next", json=plain).status_code == 200
    assert [w["worker_id"] for w in dispatcher.api.get("/workers").json()["workers"]] == ["w-1"]


def test_an_attempt_token_cannot_report_for_a_worker(dispatcher: Dispatcher) -> None:
    answer = claim(dispatcher, create_task(dispatcher)["task_id"], worker_id="w-1").json()
    token = answer["attempt_token"]
    fence = {"task_id": answer["task"]["task_id"], "attempt": 1,
             "lease_token": answer["lease_token"]}  # fmt: skip
    with httpx.Client(
        base_url=dispatcher.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as operator:
        body = {**fence, "worker": _report("spoofed", [])}
        assert operator.post("/internal/heartbeat", json=body).status_code == 200
    assert dispatcher.api.get("/workers").json()["workers"] == []


def test_reports_are_written_at_most_once_per_interval(db_url: str) -> None:
    with serve_dispatcher(db_url, worker_report_seconds=600) as d:
        body = {"worker_id": "w-1", "queue": "default", "max": 1, "worker": _report("w-1", [])}
        assert d.worker.post("/internal/task-claim-next", json=body).status_code == 200
        first = d.api.get("/workers").json()["workers"][0]["last_seen"]
        d.clock.advance(5)
        assert d.worker.post("/internal/task-claim-next", json=body).status_code == 200
        assert d.api.get("/workers").json()["workers"][0]["last_seen"] == first


def test_metrics_count_the_workers_seen_per_queue(dispatcher: Dispatcher) -> None:
    for worker_id in ("w-1", "w-2"):
        body = {"worker_id": worker_id, "queue": "a", "max": 1, "worker": _report(worker_id, [])}
        assert dispatcher.worker.post("/internal/task-claim-next", json=body).status_code == 200
    text = dispatcher.anonymous.get("/metrics").text
    assert 'taskplat_workers_seen{queue="a"} 2.0' in text
    assert 'taskplat_workers_seen{queue="default"} 2.0' in text
    dispatcher.clock.advance(31)
    text = dispatcher.anonymous.get("/metrics").text
    assert 'taskplat_workers_seen{queue="a"} 0.0' in text


def test_every_operate_and_admin_route_writes_its_audit_row(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """One successful call of each audited route of the OpenAPI document (a new one must be
    added here) writes exactly one row naming its action."""
    d = dispatcher
    document = d.anonymous.get("/openapi.json").json()
    audited = {
        operation["operationId"]
        for operations in document["paths"].values()
        for operation in operations.values()
        if operation.get("x-taskplat-scope") in ("operate", "admin")
    }
    task_id = create_task(d)["task_id"]
    dag = {"jobs": {"a": {"operator": "echo", "outputs": [{"index": 0, "dataset": "ds"}]}}}
    calls: list[tuple[str, str, str, dict[str, Any] | None]] = [
        ("cancel_task", "PUT", f"/tasks/{task_id}/cancel", None),
        ("retry_task", "POST", f"/tasks/{task_id}/retry", None),
        ("retry_tasks", "POST", "/tasks/retry", {"ids": [task_id]}),
        ("pause_queue", "PUT", "/queues/default/pause", None),
        ("resume_queue", "PUT", "/queues/default/resume", None),
        ("register_queue", "PUT", "/queues/added", None),
        ("put_dag", "PUT", "/dags/d", dag),
        ("new_dataset_version", "POST", "/datasets/{dataset}/versions", {}),
        ("make_dataset_version_current", "POST", "/datasets/{dataset}/current", {}),
        ("delete_dag", "DELETE", "/dags/d", None),
        ("create_key", "POST", "/keys", {"name": "k", "scopes": ["read"]}),
        ("list_keys", "GET", "/keys", None),
        ("list_audit", "GET", "/audit", None),
        ("revoke_key", "DELETE", "/keys/k", None),
    ]
    assert {name for name, *_ in calls} == audited, "an audited route lacks a call here"
    for action, method, path, body in calls:
        if "{dataset}" in path:
            dataset = d.api.get("/datasets").json()["datasets"][0]["dataset_uuid"]
            path = path.format(dataset=dataset)
        if action == "make_dataset_version_current":  # a rollback to the version it replaced
            versions = d.api.get(path.removesuffix("/current")).json()["versions"]
            body = {
                "dataset_version": next(v for v in versions if not v["current"])["dataset_version"]
            }
        before = len(audit_rows(db_url))
        response = d.api.request(method, path, json=body)
        assert response.status_code < 300, (action, response.text)
        rows = audit_rows(db_url)
        assert len(rows) == before + 1 and rows[-1]["action"] == action, (action, rows[before:])
