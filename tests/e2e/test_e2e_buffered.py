"""End to end, issue 12: a DAG with a buffered dataset through the real stack (dispatcher, relay,
scheduler, reaper, sink, a wrapper): records published by a task and by a plain SQS client land once
in the table, the dataset's event starts the downstream job, bad messages are in the buffer's DLQ
with their reasons, and a sink killed with SIGKILL while it drains loses nothing and writes nothing
twice."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from e2e_stack import E2EStack, e2e_stack
from psycopg import sql

from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e

ORG = "00000000-0000-4000-8000-0000000000e2"
SINK_ENV = {
    "TASKPLAT_SINK_WAIT_TIME_SECONDS": "1",
    "TASKPLAT_SINK_DISCOVERY_INTERVAL_SECONDS": "0.5",
    "TASKPLAT_SINK_VISIBILITY_TIMEOUT_SECONDS": "5",
}


def dag(dataset: str) -> dict[str, Any]:
    return {
        "jobs": {
            "produce": {
                "operator": "publish",
                "outputs": [{"index": 0, "dataset": dataset, "kind": "buffered_postgres",
                             "schema": [{"name": "severity", "type": "text"}]}],
            },
            "react": {"operator": "echo", "inputs": [{"from": {"dataset": dataset}}]},
        }
    }  # fmt: skip


@pytest.fixture(scope="module")
def stack(
    database_url: str, sqs_endpoint_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2EStack]:
    with e2e_stack(
        "buffered",
        tmp_path_factory.mktemp("stack-buffered"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=1,
        env=SINK_ENV,
    ) as running:
        yield running


def applied(stack: E2EStack, name: str) -> dict[str, Any]:
    """Apply the DAG; the dataset's view once the sink created its buffer."""
    assert stack.api.put(f"/dags/{name}", json=dag(name)).status_code == 201
    datasets = {d["name"]: d for d in stack.api.get("/datasets").json()["datasets"]}
    uuid = datasets[name]["dataset_uuid"]

    def ready() -> dict[str, Any]:
        view: dict[str, Any] = stack.api.get(f"/datasets/{uuid}").json()
        return view if view["buffer_queue_url"] else {}

    return wait_for(ready, timeout=30, what=f"the buffer of {name}")


def body(view: dict[str, Any], keys: list[str], **overrides: Any) -> str:
    records = [{"org_id": ORG, "dedupe_key": key, "severity": "info"} for key in keys]
    message = {"dataset_uuid": view["dataset_uuid"], "schema_hash": view["schema_hash"],
               "records": records, **overrides}  # fmt: skip
    return json.dumps(message)


def row_count(stack: E2EStack, view: dict[str, Any]) -> int:
    table = view["location"].removeprefix("postgres_table:")
    with psycopg.connect(stack.database_url) as conn:
        query = sql.SQL("SELECT count(*), count(DISTINCT dedupe_key) FROM {}").format(
            sql.Identifier(table)
        )
        total, distinct = conn.execute(query).fetchone() or (0, 0)
    assert total == distinct
    return int(total)


def test_records_from_a_task_and_a_plain_client_land_once_and_start_the_downstream_job(
    stack: E2EStack,
) -> None:
    view = applied(stack, "alerts")
    run = stack.api.post(
        "/dags/alerts/jobs/produce/runs",
        json={"config": {"org_id": ORG, "prefix": "k", "count": 300, "fields": {"severity": "hi"}}},
    )
    assert run.status_code == 201, run.text
    assert stack.wait_status(run.json()["task_id"], "Completed")["result"] == {"published": 300}
    # A plain SQS producer: 100 keys, half of them already published by the task.
    plain = [body(view, [f"k{n}" for n in range(250 + 10 * m, 260 + 10 * m)]) for m in range(10)]
    bad = {
        "SchemaMismatch": body(view, ["x1"], schema_hash="sha256:" + "0" * 64),
        "MalformedMessage": "{not json",
        "MalformedRecord": body(view, ["x2"], records=[{"org_id": ORG}]),
    }
    for message in [*plain, *bad.values()]:
        stack.sqs.send_message(QueueUrl=view["buffer_queue_url"], MessageBody=message)
    wait_for(lambda: row_count(stack, view) == 350, timeout=60, what="350 distinct rows")

    def routed() -> list[dict[str, Any]]:
        found = stack.api.get(f"/datasets/{view['dataset_uuid']}/events").json()["events"]
        return found if found and all(e["routed"] for e in found) else []

    events = wait_for(routed, timeout=30, what="every event of the dataset routed")
    cursors = sorted(e["cursor"] for e in events)
    assert len(set(cursors)) == len(cursors)
    react = stack.api.get("/tasks", params={"dag": "alerts", "job": "react"}).json()["tasks"]
    assert {t["inputs"][0]["cursor"] for t in react} == set(cursors)
    for task in react:
        stack.wait_status(task["task_id"], "Completed")

    dlq_url = stack.queue_url(
        f"{stack.queue_prefix}buffer-{view['dataset_uuid'].replace('-', '')}-dlq"
    )
    found: dict[str, str] = {}

    def dead_lettered() -> bool:
        answer = stack.sqs.receive_message(
            QueueUrl=dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
        )  # fmt: skip
        for message in answer.get("Messages", []):
            found[message["MessageAttributes"]["reason"]["StringValue"]] = message["Body"]
        return len(found) >= len(bad)

    wait_for(dead_lettered, timeout=30, what="three dead letters")
    assert found == bad
    final = stack.api.get(f"/datasets/{view['dataset_uuid']}").json()
    assert final["row_count"] == 350


def test_a_sink_killed_while_draining_loses_nothing_and_writes_nothing_twice(
    stack: E2EStack,
) -> None:
    view = applied(stack, "killed")
    # 300 messages of 20 records; every record is sent twice, in different messages.
    keys = [f"d{n}" for n in range(3000)]
    bodies = [body(view, keys[(i * 20) % 3000 : (i * 20) % 3000 + 20]) for i in range(300)]
    for start in range(0, len(bodies), 10):
        entries = [
            {"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[start : start + 10])
        ]
        answer = stack.sqs.send_message_batch(QueueUrl=view["buffer_queue_url"], Entries=entries)
        assert not answer.get("Failed")
    pid = stack.stack.wait_running("sink", timeout=30)
    wait_for(lambda: row_count(stack, view) > 0, timeout=60, interval=0.01, what="a first write")
    stack.stack.kill("sink", signal.SIGKILL)
    stack.stack.wait_running("sink", timeout=30, not_pid=pid)
    wait_for(lambda: row_count(stack, view) == 3000, timeout=90, what="3000 distinct rows")
    events = stack.api.get(
        f"/datasets/{view['dataset_uuid']}/events", params={"limit": 500}
    ).json()["events"]
    cursors = [e["cursor"] for e in reversed(events)]  # oldest first
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    assert cursors[-1] >= 3000
