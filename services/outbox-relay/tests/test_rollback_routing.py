"""Rollback and routing through the real relay and a real dispatcher: a rollback cancels the tasks
routed from the version it replaces and the restored version's next event routes again; and two
relays routing while a loop rolls the same dataset back and forth never route an event of a
version that is not current when the routing commits."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

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
                      "inputs": [{"from": {"job": "source", "output_index": 0}}]},
        "audit": {"operator": "echo", "inputs": [{"from": {"dataset": "blocks"}}]},
    }
}  # fmt: skip
ROLLBACKS = 40

# Test instrumentation: at the commit of every transaction that routes an event (a deferred
# trigger, so it runs last, with a fresh snapshot), record the dataset's current version then.
AUDIT = """
CREATE TABLE routing_audit (event_id bigint, dataset_version uuid, current_version uuid);
CREATE FUNCTION routing_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO routing_audit
    SELECT NEW.event_id, NEW.dataset_version, d.current_version
    FROM datasets AS d WHERE d.dataset_uuid = NEW.dataset_uuid;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER routing_audit AFTER UPDATE ON task_events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.routed_at IS NULL AND NEW.routed_at IS NOT NULL AND NEW.route_reason IS NULL)
    EXECUTE FUNCTION routing_audit();
"""


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


def event(dataset: dict[str, Any], version: str, cursor: int) -> dict[str, Any]:
    return {"dataset_uuid": dataset["dataset_uuid"], "dataset_version": version, "cursor": cursor}


def drain(relay: Relay) -> None:
    for _ in range(1000):
        if not relay.run_once().claimed:
            return
    raise AssertionError("the relay did not drain its outbox")


def make_current(d: Dispatcher, dataset: dict[str, Any], version: str) -> dict[str, Any]:
    response = d.api.post(
        f"/datasets/{dataset['dataset_uuid']}/current", json={"dataset_version": version}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def routed_tasks(db_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT t.task_id, t.status, t.cancel_reason, t.inputs -> 0 ->> 'cursor' AS cursor, "
            "p.dataset_version::text AS pinned "
            "FROM tasks AS t JOIN task_pins AS p ON p.task_id = t.task_id "
            "ORDER BY t.created_at, t.task_id"
        ).fetchall()


def test_a_rollback_cancels_the_replaced_versions_tasks_and_the_restored_version_routes(
    dispatcher: Dispatcher, relay: Relay, db_url: str
) -> None:
    d = dispatcher
    dataset = blocks(d)
    v1 = dataset["current_version"]
    first, second = producer(d), producer(d)
    emit_events(d, first, [event(dataset, v1, 1)])
    drain(relay)
    response = d.api.post(f"/datasets/{dataset['dataset_uuid']}/versions", json={})
    v2 = response.json()["dataset"]["current_version"]
    assert response.json()["canceled_tasks"] == 2  # transform and audit of cursor 1
    emit_events(d, first, [event(dataset, v2, 2)])
    drain(relay)
    on_v2 = [t for t in routed_tasks(db_url) if t["pinned"] == v2]
    assert [(t["cursor"], t["status"]) for t in on_v2] == [("2", "Queued")] * 2

    body = make_current(d, dataset, v1)
    assert body["canceled_tasks"] == 2 and body["dataset"]["current_version"] == v1
    # Events of the restored version route again: a new position creates tasks, a position
    # already routed in that version is a Duplicate, and the replaced version is not current.
    emit_events(d, first, [event(dataset, v1, 3), event(dataset, v2, 4)])
    emit_events(d, second, [event(dataset, v1, 1)])
    drain(relay)
    tasks = routed_tasks(db_url)
    assert sorted((t["cursor"], t["pinned"], t["status"], t["cancel_reason"]) for t in tasks) == [
        ("1", v1, "Canceled", "VersionSuperseded"), ("1", v1, "Canceled", "VersionSuperseded"),
        ("2", v2, "Canceled", "VersionSuperseded"), ("2", v2, "Canceled", "VersionSuperseded"),
        ("3", v1, "Queued", None), ("3", v1, "Queued", None),
    ]  # fmt: skip
    listed = d.api.get(f"/datasets/{dataset['dataset_uuid']}/events").json()["events"]
    outcomes = {(e["cursor"], e["producer"]["task_id"]): (e["routed"], e["reason"]) for e in listed}
    assert outcomes == {
        (1, first.task_id): (True, None),
        (2, first.task_id): (True, None),
        (3, first.task_id): (True, None),
        (4, first.task_id): (False, "NotCurrentVersion"),
        (1, second.task_id): (False, "Duplicate"),
    }
    versions = {v["dataset_version"]: v for v in d.api.get(
        f"/datasets/{dataset['dataset_uuid']}").json()["versions"]}  # fmt: skip
    assert (versions[v1]["became_current"], versions[v2]["became_current"]) == (
        "rollback",
        "created",
    )


def _in_thread(target: Callable[[], None], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_racing_rollbacks_never_let_an_event_of_a_non_current_version_route(
    dispatcher: Dispatcher,
    settings: RelaySettings,
    pool: ConnectionPool[Connection[DictRow]],
    db_url: str,
) -> None:
    d = dispatcher
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(AUDIT)
    dataset = blocks(d)
    v1 = dataset["current_version"]
    v2 = d.api.post(f"/datasets/{dataset['dataset_uuid']}/versions", json={}).json()["dataset"][
        "current_version"
    ]
    lease = producer(d)
    relays = [
        Relay(settings, pool=pool, sqs=sqs_client(settings), clock=FakeClock()) for _ in range(2)
    ]
    done = threading.Event()
    errors: list[BaseException] = []

    def roll() -> None:
        try:
            for n in range(ROLLBACKS):
                make_current(d, dataset, v1 if n % 2 == 0 else v2)
        finally:
            done.set()

    def emit() -> None:
        cursor = 0
        while not done.is_set():
            batch = [event(dataset, v, cursor + i) for i, v in enumerate((v1, v2, v1, v2))]
            assert emit_events(d, lease, batch).status_code == 200
            cursor += len(batch)

    def route(relay: Relay) -> Callable[[], None]:
        def loop() -> None:
            while not done.is_set():
                relay.run_once()
            drain(relay)

        return loop

    threads = [_in_thread(roll, errors), _in_thread(emit, errors)]
    threads += [_in_thread(route(relay), errors) for relay in relays]
    for thread in threads:
        thread.join(timeout=120)
    for relay in relays:
        drain(relay)
        relay.close()
    assert not errors and not any(thread.is_alive() for thread in threads)

    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        audit = conn.execute("SELECT * FROM routing_audit").fetchall()
        reasons = {
            row["route_reason"]: row["n"]
            for row in conn.execute(
                "SELECT route_reason, count(*) AS n FROM task_events "
                "WHERE dataset_uuid = %s GROUP BY route_reason",
                (dataset["dataset_uuid"],),
            ).fetchall()
        }
    # The race was run: events of both versions were routed and others refused as not current.
    assert {str(row["dataset_version"]) for row in audit} == {v1, v2}
    assert reasons.get("NotCurrentVersion", 0) > 0 and None in reasons
    stale = [row for row in audit if row["dataset_version"] != row["current_version"]]
    assert stale == [], "events routed while their version was not current at commit"
    current = blocks(d)["current_version"]
    live = [t for t in routed_tasks(db_url) if t["status"] == "Queued"]
    assert all(t["pinned"] == current for t in live), "a live task pinned to a non-current version"
