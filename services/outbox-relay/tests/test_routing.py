"""Routing events to downstream jobs, through the real relay and a real dispatcher: exactly one
task per (job, dataset, version, position) under duplicate events and two racing relays; a
second producer's event at a routed position is kept as `Duplicate`; events of an older version or
an unknown dataset create nothing and say why; a failed routing keeps nothing and is retried."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool
from relay_harness import Queues

from taskplat.common.clock import FakeClock
from taskplat.common.sqs import sqs_client
from taskplat.outbox_relay.relay import Relay
from taskplat.outbox_relay.settings import RelaySettings
from taskplat.testkit.dispatcher_calls import Lease, claimed, emit_events
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher

PIPELINE = {
    "jobs": {
        "source": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"}]},
        "transform": {"operator": "emit",
                      "inputs": [{"from": {"job": "source", "output_index": 0}}],
                      "outputs": [{"index": 0, "dataset": "enriched"}]},
        "audit": {"operator": "echo",
                  "inputs": [{"from": {"dataset": "blocks"}, "where": "n > 1"}]},
    }
}  # fmt: skip


@pytest.fixture
def dispatcher(db_url: str, queues: Queues) -> Iterator[Dispatcher]:
    queues.create("default")
    with serve_dispatcher(db_url) as served:
        assert served.api.put("/dags/p", json=PIPELINE).status_code == 201
        yield served


def blocks(d: Dispatcher) -> dict[str, Any]:
    found = [each for each in d.api.get("/datasets").json()["datasets"] if each["name"] == "blocks"]
    return found[0]


def producer(d: Dispatcher) -> Lease:
    run = d.api.post("/dags/p/jobs/source/runs", json={}).json()
    return claimed(d, run["task_id"])


def event(dataset: dict[str, Any], **position: Any) -> dict[str, Any]:
    return {"dataset_uuid": dataset["dataset_uuid"],
            "dataset_version": dataset["current_version"], **position}  # fmt: skip


def drain(relay: Relay) -> None:
    for _ in range(100):
        if not relay.run_once().claimed:
            return
    raise AssertionError("the relay did not drain its outbox")


def job_tasks(db_url: str, job: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT task_id, inputs, status FROM tasks WHERE job ->> 'name' = %s "
            "ORDER BY created_at",
            (job,),
        ).fetchall()


def test_duplicate_events_start_each_downstream_job_once(
    dispatcher: Dispatcher, relay: Relay, db_url: str
) -> None:
    d = dispatcher
    dataset = blocks(d)
    first, second = producer(d), producer(d)
    e10 = event(dataset, cursor=10)
    partition = event(dataset, partition_key="1-5", start=1, end=5)
    assert emit_events(d, first, [e10, partition]).json()["accepted"] == 2
    assert emit_events(d, first, [e10]).json()["accepted"] == 0  # a repeat is not stored
    assert emit_events(d, second, [e10]).json()["accepted"] == 1  # another producer, same position
    drain(relay)
    drain(relay)  # nothing left to do: a second pass creates nothing

    transform, audit = job_tasks(db_url, "transform"), job_tasks(db_url, "audit")
    assert len(transform) == 2 and len(audit) == 2
    assert sorted(str(t["inputs"][0].get("cursor")) for t in transform) == ["10", "None"]
    assert {t["inputs"][0].get("where") for t in audit} == {"n > 1"}
    assert all(t["inputs"][0]["dataset_version"] == dataset["current_version"] for t in transform)
    listed = d.api.get(f"/datasets/{dataset['dataset_uuid']}/events").json()["events"]
    # Stored for audit, the second producer's event at the same position is not routed.
    duplicate = [each for each in listed if each["producer"]["task_id"] == second.task_id]
    assert [(each["routed"], each["reason"], each["tasks"]) for each in duplicate] == [
        (False, "Duplicate", [])
    ]
    routed = [each for each in listed if each["producer"]["task_id"] == first.task_id]
    assert [(each["routed"], each["reason"], len(each["tasks"])) for each in routed] == [
        (True, None, 2),
        (True, None, 2),
    ]
    # The downstream tasks are Queued with their wake-ups sent by the relay.
    assert {t["status"] for t in transform + audit} == {"Queued"}


def test_two_relays_racing_route_every_event_exactly_once(
    dispatcher: Dispatcher,
    settings: RelaySettings,
    pool: ConnectionPool[Connection[DictRow]],
    db_url: str,
) -> None:
    d = dispatcher
    dataset = blocks(d)
    leases = [producer(d) for _ in range(4)]
    for lease in leases:  # every producer emits the same 30 positions
        emit_events(d, lease, [event(dataset, cursor=n) for n in range(30)])
    relays = [
        Relay(settings, pool=pool, sqs=sqs_client(settings), clock=FakeClock()) for _ in range(2)
    ]
    errors: list[BaseException] = []

    def run(relay: Relay) -> None:
        try:
            drain(relay)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(relay,)) for relay in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for relay in relays:
        relay.close()
    assert not errors
    for job in ("transform", "audit"):
        cursors = sorted(t["inputs"][0]["cursor"] for t in job_tasks(db_url, job))
        assert cursors == list(range(30)), job


def test_old_versions_and_unknown_datasets_are_stored_but_not_routed(
    dispatcher: Dispatcher, relay: Relay, db_url: str
) -> None:
    d = dispatcher
    dataset = blocks(d)
    lease = producer(d)
    old = event(dataset, cursor=1)
    assert d.api.post(f"/datasets/{dataset['dataset_uuid']}/versions", json={}).status_code == 201
    ghost = {"dataset_uuid": str(uuid4()), "dataset_version": str(uuid4()), "cursor": 1}
    assert emit_events(d, lease, [old, ghost]).json()["accepted"] == 2
    drain(relay)
    assert job_tasks(db_url, "transform") == [] and job_tasks(db_url, "audit") == []
    listed = d.api.get(f"/datasets/{dataset['dataset_uuid']}/events").json()["events"]
    assert [(e["routed"], e["reason"], e["tasks"]) for e in listed] == [
        (False, "NotCurrentVersion", []),
    ]  # fmt: skip
    with psycopg.connect(db_url) as conn:
        reasons = conn.execute("SELECT route_reason FROM task_events ORDER BY event_id").fetchall()
    assert reasons == [("NotCurrentVersion",), ("UnknownDataset",)]


def test_a_routing_that_fails_keeps_nothing_and_is_retried(
    dispatcher: Dispatcher, relay: Relay, db_url: str
) -> None:
    d = dispatcher
    dataset = blocks(d)
    lease = producer(d)
    emit_events(d, lease, [event(dataset, cursor=3)])
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE event_routes ADD CONSTRAINT no_routes CHECK (false) NOT VALID")
    batch = relay.run_once()
    assert batch.failed == 1 and batch.routed == 0
    assert job_tasks(db_url, "transform") == []
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT last_error, sent_at FROM outbox WHERE kind = 'route_event'"
        ).fetchone()
        assert row is not None and row[1] is None and "routing failed" in row[0]
        conn.execute("ALTER TABLE event_routes DROP CONSTRAINT no_routes")
        conn.execute("UPDATE outbox SET available_at = now() - interval '1 day'")
    retried = relay.run_once()
    assert retried.routed == 1
    assert len(job_tasks(db_url, "transform")) == 1
