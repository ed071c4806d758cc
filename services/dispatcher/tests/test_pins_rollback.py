"""Pins, versions and rollback against a real Postgres: a task of a job created by `POST /tasks`
or `POST /tasks/batch` is pinned (to the current version when its input names none) and canceled
by a new version; a rollback cancels exactly the live tasks pinned to the version that stops
being current and lists how each version became current; a replay of a task pinned to a version
that is no longer current is refused (`PinnedVersionNotCurrent`, single and bulk) unless it
re-pins; untrusted work is refused (422 naming the missing setting) while no capability keys are
configured; tasks created while a loop rolls the dataset back and forth are pinned to the version
current when they commit."""

from __future__ import annotations

import json
import threading
from typing import Any
from uuid import uuid4

import psycopg

from taskplat.common.tokens.keys import private_key_pem
from taskplat.testkit.dispatcher_calls import claimed, complete, create_task, get_task, heartbeat
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.dispatcher_rows import task_pins

DAG: dict[str, Any] = {
    "jobs": {
        "source": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"},
                                                   {"index": 1, "dataset": "prices"}]},
        "transform": {"operator": "emit",
                      "inputs": [{"from": {"job": "source", "output_index": 0}}]},
    }
}  # fmt: skip
CAP_KEYS = {
    "capability_token_keys": json.dumps({"c1": private_key_pem(b"\x13" * 32)}),
    "capability_token_active_kid": "c1",
}
JOB = {"dag_name": "p", "name": "transform"}


def datasets(d: Dispatcher) -> dict[str, dict[str, Any]]:
    return {each["name"]: each for each in d.api.get("/datasets").json()["datasets"]}


def job_task(d: Dispatcher, *inputs: dict[str, Any]) -> dict[str, Any]:
    return create_task(d, operator="emit", job=JOB, inputs=list(inputs))


def new_version(d: Dispatcher, dataset: dict[str, Any]) -> dict[str, Any]:
    response = d.api.post(f"/datasets/{dataset['dataset_uuid']}/versions", json={})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def roll_back(d: Dispatcher, dataset: dict[str, Any], version: str) -> dict[str, Any]:
    response = d.api.post(
        f"/datasets/{dataset['dataset_uuid']}/current", json={"dataset_version": version}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def status(d: Dispatcher, task_id: str) -> tuple[str, str | None]:
    view = get_task(d, task_id)
    return view["status"], view["cancel_reason"]


def test_a_created_task_of_a_job_is_pinned_and_canceled_by_a_new_version(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    assert d.api.put("/dags/p", json=DAG).status_code == 201
    blocks, prices = datasets(d)["blocks"], datasets(d)["prices"]
    v1 = blocks["current_version"]
    # No version named: pinned to the current one, written into the task's inputs.
    unversioned = job_task(d, {"dataset_uuid": blocks["dataset_uuid"], "cursor": 3})
    assert unversioned["inputs"] == [
        {"dataset_uuid": blocks["dataset_uuid"], "cursor": 3, "dataset_version": v1}
    ]
    assert task_pins(db_url, unversioned["task_id"]) == [(blocks["dataset_uuid"], v1)]
    response = d.api.post("/tasks/batch", json={"tasks": [
        {"operator": "emit", "job": JOB, "inputs": [{"dataset_uuid": blocks["dataset_uuid"]}]},
        {"operator": "emit", "job": JOB, "inputs": [
            {"dataset_uuid": prices["dataset_uuid"],
             "dataset_version": prices["current_version"]}]},
        {"operator": "emit", "inputs": [{"dataset_uuid": blocks["dataset_uuid"]}]},
    ]})  # fmt: skip
    assert response.status_code == 201, response.text
    batch = [each["task"]["task_id"] for each in response.json()["results"]]
    assert task_pins(db_url, batch[0]) == [(blocks["dataset_uuid"], v1)]
    assert task_pins(db_url, batch[1]) == [(prices["dataset_uuid"], prices["current_version"])]
    assert task_pins(db_url, batch[2]) == []  # a task of no job: its inputs are the operator's data
    running = job_task(d, {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": v1})
    claimed(d, running["task_id"])

    body = new_version(d, blocks)
    assert body["canceled_tasks"] == 3
    for task_id in (unversioned["task_id"], batch[0], running["task_id"]):
        assert status(d, task_id) == ("Canceled", "VersionSuperseded")
    assert status(d, batch[1]) == ("Queued", None)
    assert status(d, batch[2]) == ("Queued", None)


def test_inputs_naming_an_unknown_dataset_or_version_are_refused(dispatcher: Dispatcher) -> None:
    d = dispatcher
    assert d.api.put("/dags/p", json=DAG).status_code == 201
    blocks = datasets(d)["blocks"]
    cases = [
        ({"dataset_uuid": str(uuid4())}, "dataset_uuid"),
        ({"dataset_uuid": blocks["dataset_uuid"], "dataset_version": str(uuid4())},
         "dataset_version"),
        ({"dataset_uuid": "nope"}, "dataset_uuid"),
        ({"dataset_uuid": blocks["dataset_uuid"], "dataset_version": 7}, "dataset_version"),
    ]  # fmt: skip
    for entry, field in cases:
        response = d.api.post("/tasks", json={"operator": "emit", "job": JOB, "inputs": [entry]})
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["body", "inputs", 0, field]
        batch = d.api.post("/tasks/batch", json={"tasks": [
            {"operator": "emit", "job": JOB, "inputs": [entry]}]})  # fmt: skip
        assert batch.status_code == 422, batch.text
    run = d.api.post("/dags/p/jobs/transform/runs", json={"inputs": [
        {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": str(uuid4())}]})  # fmt: skip
    assert run.status_code == 422, run.text
    assert d.api.get("/tasks", params={"dag": "p"}).json()["tasks"] == []


def test_a_rollback_cancels_exactly_the_tasks_pinned_to_the_version_it_replaces(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    assert d.api.put("/dags/p", json=DAG).status_code == 201
    blocks, prices = datasets(d)["blocks"], datasets(d)["prices"]
    v1 = blocks["current_version"]
    v2 = new_version(d, blocks)["dataset"]["current_version"]
    on_v2 = job_task(d, {"dataset_uuid": blocks["dataset_uuid"]})
    running_v2 = job_task(d, {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": v2})
    lease = claimed(d, running_v2["task_id"])
    done_v2 = job_task(d, {"dataset_uuid": blocks["dataset_uuid"], "dataset_version": v2})
    assert complete(d, claimed(d, done_v2["task_id"])).status_code == 200
    other = job_task(d, {"dataset_uuid": prices["dataset_uuid"]})
    unpinned = create_task(d, operator="emit", job=JOB)

    d.clock.advance(60)
    body = roll_back(d, blocks, v1)
    assert body["canceled_tasks"] == 2
    view = body["dataset"]
    assert view["current_version"] == v1
    versions = {each["dataset_version"]: each for each in view["versions"]}
    assert set(versions) == {v1, v2}  # versions are never deleted
    assert (versions[v1]["current"], versions[v1]["became_current"]) == (True, "rollback")
    assert versions[v1]["superseded_at"] is None
    assert versions[v1]["current_since"] > versions[v1]["created_at"]
    assert (versions[v2]["current"], versions[v2]["became_current"]) == (False, "created")
    assert versions[v2]["superseded_at"] is not None
    assert view["versions"][0]["dataset_version"] == v1  # current first
    assert status(d, on_v2["task_id"]) == ("Canceled", "VersionSuperseded")
    assert status(d, running_v2["task_id"]) == ("Canceled", "VersionSuperseded")
    refused = heartbeat(d, lease)
    assert refused.status_code == 409 and refused.json()["reason"] == "Canceled"
    assert status(d, done_v2["task_id"]) == ("Completed", None)
    assert status(d, other["task_id"]) == ("Queued", None)
    assert status(d, unpinned["task_id"]) == ("Queued", None)
    # A new task now pins the restored version; the current version again changes nothing.
    assert job_task(d, {"dataset_uuid": blocks["dataset_uuid"]})["inputs"][0][
        "dataset_version"] == v1  # fmt: skip
    again = roll_back(d, blocks, v1)
    assert again["canceled_tasks"] == 0
    assert again["dataset"]["versions"] == view["versions"]

    ghost = str(uuid4())
    path = f"/datasets/{blocks['dataset_uuid']}/current"
    unknown = d.api.post(path, json={"dataset_version": ghost})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == [
        "body", "dataset_version"]  # fmt: skip
    of_another = d.api.post(path, json={"dataset_version": prices["current_version"]})
    assert of_another.status_code == 422
    assert d.api.post(f"/datasets/{ghost}/current", json={"dataset_version": v1}).status_code == 404
    assert d.api.post(path, json={}).status_code == 422
    assert d.api.post(path, json={"dataset_version": "nope"}).status_code == 422


def test_a_replay_of_a_task_pinned_to_a_superseded_version_is_refused_unless_it_repins(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    assert d.api.put("/dags/p", json=DAG).status_code == 201
    blocks, prices = datasets(d)["blocks"], datasets(d)["prices"]
    v1 = blocks["current_version"]
    both = [
        {"dataset_uuid": blocks["dataset_uuid"], "cursor": 9},
        {"dataset_uuid": prices["dataset_uuid"], "cursor": 1},
    ]
    single = job_task(d, *both)["task_id"]
    listed = [job_task(d, *both)["task_id"] for _ in range(2)]
    plain = create_task(d, operator="emit")["task_id"]
    assert d.api.put(f"/tasks/{plain}/cancel").status_code == 200
    v2 = new_version(d, blocks)["dataset"]["current_version"]

    refused = d.api.post(f"/tasks/{single}/retry")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "PinnedVersionNotCurrent"
    assert status(d, single) == ("Canceled", "VersionSuperseded")
    assert d.api.post(f"/tasks/{single}/retry", json={"repin": False}).status_code == 409
    repinned = d.api.post(f"/tasks/{single}/retry", json={"repin": True})
    assert repinned.status_code == 200, repinned.text
    view = repinned.json()
    assert view["status"] == "Queued" and view["attempt"] == 2
    assert view["inputs"] == [
        {**both[0], "dataset_version": v2},
        {**both[1], "dataset_version": prices["current_version"]},
    ]
    assert task_pins(db_url, single) == sorted(
        [(blocks["dataset_uuid"], v2), (prices["dataset_uuid"], prices["current_version"])]
    )

    bulk = d.api.post("/tasks/retry", json={"ids": [*listed, plain]})
    assert bulk.status_code == 200, bulk.text
    assert bulk.json()["replayed"] == [plain]
    assert sorted((each["task_id"], each["reason"]) for each in bulk.json()["skipped"]) == sorted(
        (task_id, "PinnedVersionNotCurrent") for task_id in listed
    )
    by_filter = d.api.post("/tasks/retry", json={"status": "Canceled", "dag": "p"}).json()
    assert by_filter["replayed"] == []
    assert {each["task_id"] for each in by_filter["skipped"]} == set(listed)
    # Rolled back to the pinned version, a task replays without re-pinning.
    roll_back(d, blocks, v1)
    assert status(d, single) == ("Canceled", "VersionSuperseded")
    back = d.api.post("/tasks/retry", json={"ids": listed[:1]}).json()
    assert back == {"replayed": listed[:1], "skipped": []}
    assert (blocks["dataset_uuid"], v1) in task_pins(db_url, listed[0])
    new_version(d, blocks)
    forced = d.api.post("/tasks/retry", json={"ids": listed, "repin": True}).json()
    assert sorted(forced["replayed"]) == sorted(listed) and forced["skipped"] == []
    current = datasets(d)["blocks"]["current_version"]
    for task_id in listed:
        assert get_task(d, task_id)["inputs"][0]["dataset_version"] == current


def test_untrusted_work_is_refused_without_capability_keys(db_url: str) -> None:
    untrusted_dag = {"jobs": {"udf": {"operator": "echo", "trust": "untrusted"}}}
    with serve_dispatcher(db_url, untrusted_operators="sandboxed") as d:
        refused = d.api.put("/dags/u", json=untrusted_dag)
        assert refused.status_code == 422, refused.text
        assert "TASKPLAT_CAPABILITY_TOKEN_KEYS" in refused.json()["message"]
        assert d.api.get("/dags/u").status_code == 404
        listed = d.api.put("/dags/v", json={"jobs": {"s": {"operator": "sandboxed"}}})
        assert listed.status_code == 422 and "TASKPLAT_CAPABILITY_TOKEN_KEYS" in listed.text
        created = d.api.post("/tasks", json={"operator": "sandboxed"})
        assert created.status_code == 422 and "TASKPLAT_CAPABILITY_TOKEN_KEYS" in created.text
        batch = d.api.post("/tasks/batch", json={"tasks": [{"operator": "sandboxed"}]})
        assert batch.status_code == 422 and "TASKPLAT_CAPABILITY_TOKEN_KEYS" in batch.text
        assert d.api.post("/tasks", json={"operator": "echo"}).status_code == 201
    with serve_dispatcher(db_url, **CAP_KEYS) as keyed:
        assert keyed.api.put("/dags/u", json=untrusted_dag).status_code == 201
        assert keyed.api.post("/tasks", json={"operator": "echo", "job": {
            "dag_name": "u", "name": "udf"}}).status_code == 201  # fmt: skip
    # The keys removed, a task of the untrusted job is refused however it would be created.
    with serve_dispatcher(db_url) as d:
        job = {"dag_name": "u", "name": "udf"}
        created = d.api.post("/tasks", json={"operator": "echo", "job": job})
        assert created.status_code == 422 and "TASKPLAT_CAPABILITY_TOKEN_KEYS" in created.text
        run = d.api.post("/dags/u/jobs/udf/runs", json={})
        assert run.status_code == 422 and "TASKPLAT_CAPABILITY_TOKEN_KEYS" in run.text


PIN_AUDIT = """
CREATE TABLE pin_audit (task_id uuid, dataset_version uuid, current_version uuid);
CREATE FUNCTION pin_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pin_audit
    SELECT NEW.task_id, NEW.dataset_version, d.current_version
    FROM datasets AS d WHERE d.dataset_uuid = NEW.dataset_uuid;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER pin_audit AFTER INSERT ON task_pins
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pin_audit();
"""


def test_tasks_created_during_rollbacks_are_pinned_to_the_version_current_at_commit(
    dispatcher: Dispatcher, db_url: str
) -> None:
    """Creates (single and bulk) racing a rollback loop: each pin, checked at its transaction's
    commit (a deferred trigger of the test), names the version current then."""
    d = dispatcher
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(PIN_AUDIT)
    assert d.api.put("/dags/p", json=DAG).status_code == 201
    blocks = datasets(d)["blocks"]
    v1 = blocks["current_version"]
    v2 = new_version(d, blocks)["dataset"]["current_version"]
    done = threading.Event()
    errors: list[BaseException] = []
    entry = {"operator": "emit", "job": JOB, "inputs": [{"dataset_uuid": blocks["dataset_uuid"]}]}

    def roll() -> None:
        try:
            for n in range(30):
                roll_back(d, blocks, v1 if n % 2 == 0 else v2)
        finally:
            done.set()

    def create() -> None:
        while not done.is_set():
            assert d.api.post("/tasks", json=entry).status_code == 201
            assert d.api.post("/tasks/batch", json={"tasks": [entry] * 3}).status_code == 201

    def guarded(target: Any) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    threads = [guarded(roll), guarded(create), guarded(create)]
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(thread.is_alive() for thread in threads)
    with psycopg.connect(db_url) as conn:
        audit = conn.execute("SELECT dataset_version, current_version FROM pin_audit").fetchall()
        live = conn.execute(
            "SELECT DISTINCT p.dataset_version::text FROM task_pins AS p "
            "JOIN tasks AS t ON t.task_id = p.task_id WHERE t.status = 'Queued'"
        ).fetchall()
    assert {str(row[0]) for row in audit} == {v1, v2}  # the race was run
    assert [row for row in audit if row[0] != row[1]] == []
    assert live == [] or live == [(datasets(d)["blocks"]["current_version"],)]


def test_a_run_input_naming_no_version_is_pinned_to_the_current_one(
    dispatcher: Dispatcher, db_url: str
) -> None:
    d = dispatcher
    assert d.api.put("/dags/p", json=DAG).status_code == 201
    blocks = datasets(d)["blocks"]
    body = {"inputs": [{"dataset_uuid": blocks["dataset_uuid"], "cursor": 4}]}
    run = d.api.post("/dags/p/jobs/transform/runs", json=body)
    assert run.status_code == 201, run.text
    task = run.json()
    assert task["inputs"] == [{**body["inputs"][0], "dataset_version": blocks["current_version"]}]
    pinned = task_pins(db_url, task["task_id"])
    assert pinned == [(blocks["dataset_uuid"], blocks["current_version"])]
    assert new_version(d, blocks)["canceled_tasks"] == 1
