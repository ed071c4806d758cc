"""End to end, issue 11: a three-job pipeline through the real stack (dispatcher, relay,
scheduler, reaper, two wrappers): events start each downstream job exactly once; a relay killed
with SIGKILL between creating the downstream tasks and committing leaves none of them, and its
restart routes every event once."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from e2e_stack import E2EStack, e2e_stack
from psycopg.rows import dict_row

from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e


def pipeline(dag: str) -> dict[str, Any]:
    """The three-job pipeline of a DAG, on datasets of its own: another DAG's source emitting the
    same positions on shared datasets would only make `Duplicate` events."""
    text = json.dumps(PIPELINE).replace('"blocks"', f'"{dag}_blocks"')
    document: dict[str, Any] = json.loads(text.replace('"enriched"', f'"{dag}_enriched"'))
    return document


PIPELINE: dict[str, Any] = {
    "jobs": {
        "source": {
            "operator": "emit",
            "config": {"events": [{"output_index": 0, "cursor": n} for n in (1, 2, 3)]},
            "outputs": [{"index": 0, "dataset": "blocks"}],
        },
        "transform": {
            "operator": "emit",
            "config": {"forward": True},
            "inputs": [{"from": {"job": "source", "output_index": 0}}],
            "outputs": [{"index": 0, "dataset": "enriched"}],
        },
        "report": {"operator": "echo", "inputs": [{"from": {"dataset": "enriched"}}]},
    }
}
HOLD_KEY = 4242
HELD_WAKEUP_SECONDS = 30


@pytest.fixture(scope="module")
def stack(
    database_url: str, sqs_endpoint_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2EStack]:
    with e2e_stack(
        "pipeline",
        tmp_path_factory.mktemp("stack-pipeline"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=2,
        # A wake-up held while the workers wait on the dispatcher is due this much later: a run
        # that waited for SQS would start after it (test_a_routed_run_starts_without_sqs).
        env={"TASKPLAT_POLLED_WAKEUP_DELAY_SECONDS": str(HELD_WAKEUP_SECONDS)},
    ) as running:
        yield running


def job_tasks(stack: E2EStack, dag: str, job: str) -> list[dict[str, Any]]:
    response = stack.api.get("/tasks", params={"dag": dag, "job": job, "limit": 500})
    assert response.status_code == 200, response.text
    tasks: list[dict[str, Any]] = response.json()["tasks"]
    return tasks


def wait_completed(stack: E2EStack, dag: str, job: str, count: int) -> list[dict[str, Any]]:
    def done() -> bool:
        tasks = job_tasks(stack, dag, job)
        return len(tasks) >= count and all(t["status"] == "Completed" for t in tasks)

    wait_for(done, timeout=90, what=f"{count} completed tasks of {dag}/{job}")
    tasks = job_tasks(stack, dag, job)
    assert len(tasks) == count, [t["inputs"] for t in tasks]
    return tasks


def positions(tasks: list[dict[str, Any]]) -> list[int]:
    return sorted(task["inputs"][0]["cursor"] for task in tasks)


def run_pipeline(stack: E2EStack, dag: str) -> None:
    assert stack.api.put(f"/dags/{dag}", json=pipeline(dag)).status_code == 201
    run = stack.api.post(f"/dags/{dag}/jobs/source/runs", json={})
    assert run.status_code == 201, run.text


def test_events_flow_through_three_jobs_each_started_once(stack: E2EStack) -> None:
    run_pipeline(stack, "flow")
    wait_completed(stack, "flow", "source", 1)
    transform = wait_completed(stack, "flow", "transform", 3)
    report = wait_completed(stack, "flow", "report", 3)
    assert positions(transform) == positions(report) == [1, 2, 3]
    datasets = {d["name"]: d for d in stack.api.get("/datasets").json()["datasets"]}
    for name in ("flow_blocks", "flow_enriched"):
        events = stack.api.get(f"/datasets/{datasets[name]['dataset_uuid']}/events").json()
        assert len(events["events"]) == 3
        assert all(e["routed"] and len(e["tasks"]) == 1 for e in events["events"]), events
    # Each downstream task reads the version its event was emitted at, and ran once.
    for task in transform + report:
        assert len(task["attempts"]) == 1
        assert task["inputs"][0]["dataset_version"] in {
            d["current_version"] for d in datasets.values()
        }


def test_a_routed_run_starts_without_sqs(stack: E2EStack) -> None:
    """A run routed from an event (and the run started by hand) is created as POST /tasks creates
    a task (taskplat_create_tasks): its wake-up is held while the workers wait on the dispatcher,
    and a waiting claim takes it at once, before the held wake-up is even due for SQS."""
    run_pipeline(stack, "hop")
    tasks = wait_completed(stack, "hop", "source", 1) + wait_completed(stack, "hop", "transform", 3)
    for task in tasks:
        (row,) = stack.rows("wakeup_and_start", task_id=task["task_id"])
        assert row["held"], task
        assert row["started_at"] < row["available_at"], row
        assert row["sent_at"] is None or row["sent_at"] >= row["available_at"], row


def test_a_relay_killed_before_routing_commits_leaves_nothing_and_routes_once(
    stack: E2EStack,
) -> None:
    holder = psycopg.connect(stack.database_url, autocommit=True)
    try:
        # Test-only fault: while the flag row exists, inserting a `transform` task waits for the
        # advisory lock this connection holds: the relay is stopped after creating downstream
        # tasks (and their route keys) and before its commit.
        holder.execute("CREATE TABLE test_hold_routing (held boolean)")
        holder.execute("INSERT INTO test_hold_routing VALUES (true)")
        holder.execute(
            """
            CREATE FUNCTION test_hold_routing() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM test_hold_routing) THEN
                    PERFORM pg_advisory_xact_lock_shared(4242);
                END IF;
                RETURN NEW;
            END $$
            """
        )
        holder.execute(
            "CREATE TRIGGER test_hold_routing AFTER INSERT ON tasks FOR EACH ROW "
            "WHEN (NEW.job ->> 'dag_name' = 'killed' AND NEW.job ->> 'name' = 'transform') "
            "EXECUTE FUNCTION test_hold_routing()"
        )
        holder.execute("SELECT pg_advisory_lock(%s)", (HOLD_KEY,))
        relay_pid = stack.stack.wait_running("relay", timeout=30)
        run_pipeline(stack, "killed")
        wait_completed(stack, "killed", "source", 1)

        def relay_waits() -> bool:
            row = holder.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
            ).fetchone()
            return row is not None and row[0] >= 1

        wait_for(relay_waits, timeout=60, what="the relay routing, held before its commit")
        stack.stack.kill("relay", signal.SIGKILL)
        assert job_tasks(stack, "killed", "transform") == []  # nothing of it is visible
        with psycopg.connect(stack.database_url, row_factory=dict_row) as conn:
            routes = conn.execute(
                "SELECT count(*) AS n FROM event_routes WHERE dag_name = 'killed'"
            ).fetchone()
        assert routes == {"n": 0}
        stack.stack.wait_running("relay", timeout=30, not_pid=relay_pid)
        holder.execute("DELETE FROM test_hold_routing")
        holder.execute("SELECT pg_advisory_unlock(%s)", (HOLD_KEY,))
        transform = wait_completed(stack, "killed", "transform", 3)
        report = wait_completed(stack, "killed", "report", 3)
        assert positions(transform) == positions(report) == [1, 2, 3]
    finally:
        holder.close()
