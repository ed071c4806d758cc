"""End to end, issue 3: tasks created over HTTP run on worker wrappers woken through SQS only.

One stack for the module (two worker wrappers, concurrency 4 each); every service is a real
process against real Postgres and a real SQS endpoint.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_stack import E2EStack, e2e_stack, marker_lines, new_marker, process_gone, read_pid

from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(
    database_url: str, sqs_endpoint_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2EStack]:
    with e2e_stack(
        "runs",
        tmp_path_factory.mktemp("stack-runs"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=2,
    ) as running:
        yield running


def test_many_tasks_each_complete_exactly_once(stack: E2EStack) -> None:
    tag = uuid.uuid4().hex
    bodies = [{"operator": "echo", "config": {"n": n, "tag": tag}} for n in range(300)]
    task_ids = stack.create_many(bodies)

    counts = stack.wait_all_terminal(task_ids, timeout=120)

    assert counts == {"Completed": 300}
    rows = stack.rows("completion_counts", ids=task_ids)
    assert len(rows) == 300
    assert all(row["attempt"] == 1 for row in rows)
    assert all(row["attempts"] == 1 and row["completions"] == 1 for row in rows)
    results = stack.rows("results", ids=task_ids)
    assert len(results) == 300
    assert all(row["result"] == row["config"] for row in results)


def test_duplicate_wake_ups_run_the_task_once(stack: E2EStack, tmp_path: Path) -> None:
    marker = new_marker(tmp_path)
    task = stack.create("record", config={"marker": str(marker), "seconds": 1.0})
    for _ in range(5):
        stack.send_wake_up(task["task_id"])

    done = stack.wait_status(task["task_id"], "Completed", "Dead", timeout=30)
    # Every duplicate was received, answered NotClaimed and deleted.
    wait_for(lambda: stack.queue_depth() == 0, timeout=30, what="the queue to drain")

    assert done["status"] == "Completed"
    assert [a["outcome"] for a in done["attempts"]] == ["Completed"]
    assert marker_lines(marker) == [f"{task['task_id']} 1"]


def test_operator_events_are_forwarded(stack: E2EStack) -> None:
    dataset, version = str(uuid.uuid4()), str(uuid.uuid4())
    events = [
        {"dataset_uuid": dataset, "dataset_version": version, "cursor": cursor}
        for cursor in (10, 20)
    ]
    task = stack.create("echo", config={"events": events})

    done = stack.wait_status(task["task_id"], "Completed", "Dead", timeout=30)

    assert done["status"] == "Completed"
    rows = stack.rows("task_events", task_id=task["task_id"])
    assert [(r["dataset_uuid"], r["dataset_version"], r["cursor"]) for r in rows] == [
        (dataset, version, 10),
        (dataset, version, 20),
    ]
    assert {r["attempt"] for r in rows} == {1}


def test_deadline_kills_the_operator(stack: E2EStack, tmp_path: Path) -> None:
    task = stack.create(
        "hang",
        config={"seconds": 120, "pid_dir": str(tmp_path)},
        timeout_seconds=3,  # enough for the operator to start even on a loaded machine
        max_attempts=1,
    )
    pid = read_pid(tmp_path, task["task_id"], 1)

    dead = stack.wait_status(task["task_id"], "Dead", "Completed", timeout=30)

    assert dead["status"] == "Dead"
    assert "deadline" in (dead["last_error"] or "").lower()
    assert dead["attempts"][0]["outcome"] in ("Failed", "DeadlineExceeded")
    wait_for(lambda: process_gone(pid), timeout=10, what=f"operator {pid} to be gone")


def test_operator_crash_reports_its_stderr(stack: E2EStack) -> None:
    message = f"crash-{uuid.uuid4().hex}: the operator fell over"
    task = stack.create("crash", config={"message": message}, max_attempts=1)

    dead = stack.wait_status(task["task_id"], "Dead", "Completed", timeout=30)

    assert dead["status"] == "Dead"
    assert message in (dead["last_error"] or "")
    assert message in (dead["attempts"][0]["error"] or "")


def test_cancel_while_running_stops_the_operator(stack: E2EStack, tmp_path: Path) -> None:
    marker = new_marker(tmp_path)
    task = stack.create(
        "hang", config={"seconds": 120, "pid_dir": str(tmp_path), "marker": str(marker)}
    )
    pid = read_pid(tmp_path, task["task_id"], 1)
    stack.wait_status(task["task_id"], "Running", timeout=10)

    response = stack.api.put(f"/tasks/{task['task_id']}/cancel")

    assert response.status_code == 200, response.text
    assert response.json()["status"] == "Canceled"
    # The wrapper learns it on its next heartbeat (about a third of the 3 s lease) and stops it.
    wait_for(lambda: process_gone(pid), timeout=15, what=f"operator {pid} to be stopped")
    final = stack.get(task["task_id"])
    assert final["status"] == "Canceled"
    assert final["result"] is None
    assert marker_lines(marker) == []


def test_sigterm_drain_hands_the_task_to_another_wrapper(stack: E2EStack, tmp_path: Path) -> None:
    marker = new_marker(tmp_path)
    task = stack.create(
        "hang",
        config={"seconds": 5, "pid_dir": str(tmp_path), "marker": str(marker)},
        backoff_base_seconds=60,  # a drained task is retried at once, not after the backoff
        max_attempts=1,  # and a drained attempt does not count against max_attempts
    )
    pid = read_pid(tmp_path, task["task_id"], 1)
    running = stack.wait_status(task["task_id"], "Running", timeout=10)
    worker_id = running["worker_id"]
    service = worker_id.rsplit(".", 1)[0]  # the stack names wrappers `<service>.<generation>`

    stack.stack.kill(service, signal.SIGTERM)

    done = stack.wait_status(task["task_id"], "Completed", "Dead", timeout=40)
    assert done["status"] == "Completed"
    first, second = done["attempts"]
    assert first["worker_id"] == worker_id
    assert first["outcome"] == "Drained"
    assert "shutting down" in (first["error"] or "")
    assert done["processing_attempts"] == 1
    assert second["outcome"] == "Completed"
    assert second["worker_id"] != worker_id
    assert process_gone(pid)
    # It drained and exited cleanly (then restarted); the supervisor notes an exit within a tick.
    exits = wait_for(lambda: stack.stack.exits(service) or None, timeout=30, what="its exit")
    assert exits == [0]
    assert marker_lines(marker) == [f"{task['task_id']} 2"]
