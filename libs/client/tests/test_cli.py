"""The `taskplat` command as a user runs it (a real process) against a real dispatcher: tables by
default, `--json` for scripts, `--help` everywhere, and every error one line on stderr with a
non-zero exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.dispatcher_calls import claimed, complete
from taskplat.testkit.dispatcher_harness import API_KEY, Dispatcher

COMMANDS = [
    [], ["submit"], ["get"], ["list"], ["cancel"], ["retry"], ["watch"], ["dead"],
    ["dead", "list"], ["dead", "replay"], ["dags"], ["dags", "apply"], ["dags", "list"],
    ["datasets"], ["datasets", "list"], ["datasets", "rollback"],
]  # fmt: skip


def _env(url: str, key: str | None = API_KEY) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKPLAT_")}
    env["TASKPLAT_URL"] = url
    if key is not None:
        env["TASKPLAT_API_KEY"] = key
    env["COLUMNS"] = "200"
    return env


def taskplat(url: str, *args: str, key: str | None = API_KEY) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskplat.client", *args],
        env=_env(url, key),
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("taskplat: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "taskplat")
def test_help_everywhere(command: list[str]) -> None:
    result = taskplat("http://127.0.0.1:9", *command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: taskplat")


def test_submit_get_list_cancel_retry(dispatcher: Dispatcher) -> None:
    url = dispatcher.base_url
    task = as_json(taskplat(url, "submit", "echo", "--config", '{"n": 2}', "-q", "alpha",
                            "--max-attempts", "1", "--json"))  # fmt: skip
    assert task["status"] == "Queued" and task["config"] == {"n": 2}
    assert task["priority"] == 5
    urgent = as_json(taskplat(url, "submit", "echo", "--priority", "0", "--json"))
    assert urgent["priority"] == 0
    assert "priority" in taskplat(url, "get", urgent["task_id"]).stdout
    assert taskplat(url, "submit", "echo", "--priority", "10").returncode == 2
    keyed = as_json(taskplat(url, "submit", "echo", "--concurrency-key", "shop-9", "--json"))
    assert keyed["concurrency_key"] == "shop-9"
    assert "shop-9" in taskplat(url, "get", keyed["task_id"]).stdout
    refused = taskplat(url, "submit", "echo", "--concurrency-key", "x" * 201)
    assert refused.returncode != 0 and "concurrency_key" in refused.stderr
    task_id = task["task_id"]
    human = taskplat(url, "get", task_id)
    assert human.returncode == 0 and "Queued" in human.stdout and "alpha" in human.stdout
    listed = as_json(taskplat(url, "--json", "list", "--queue", "alpha"))
    assert [each["task_id"] for each in listed["tasks"]] == [task_id]
    table = taskplat(url, "list", "--status", "Queued")
    assert task_id in table.stdout and "STATUS" in table.stdout
    lease = claimed(dispatcher, task_id)
    assert complete(dispatcher, lease, "Failed", error_message="boom").status_code == 200
    dead = as_json(taskplat(url, "dead", "list", "--json"))
    assert [each["task_id"] for each in dead["tasks"]] == [task_id]
    assert as_json(taskplat(url, "retry", task_id, "--json"))["status"] == "Queued"
    assert as_json(taskplat(url, "cancel", task_id, "--json"))["status"] == "Canceled"


def test_dead_replay_by_ids_all_and_filter(dispatcher: Dispatcher) -> None:
    url = dispatcher.base_url

    def dead(queue: str) -> str:
        task = as_json(taskplat(url, "submit", "echo", "-q", queue, "--max-attempts", "1",
                                "--json"))  # fmt: skip
        lease = claimed(dispatcher, task["task_id"])
        assert complete(dispatcher, lease, "Failed", error_message="x").status_code == 200
        return str(task["task_id"])

    first, second, third = dead("alpha"), dead("alpha"), dead("beta")
    one = as_json(taskplat(url, "dead", "replay", first, "--json"))
    assert one == {"replayed": [first], "skipped": []}
    by_queue = as_json(taskplat(url, "dead", "replay", "--queue", "beta", "--json"))
    assert by_queue["replayed"] == [third]
    everything = taskplat(url, "dead", "replay", "--all")
    assert everything.returncode == 0 and "replayed 1 task(s)" in everything.stdout
    assert second in everything.stdout
    missing = taskplat(url, "dead", "replay", str(uuid4()))
    assert missing.returncode == 1 and "NotFound" in missing.stdout
    assert_one_line_error(taskplat(url, "dead", "replay"), "give task IDs")


def test_retry_and_dead_replay_repin_a_task_pinned_to_a_superseded_version(
    dispatcher: Dispatcher,
) -> None:
    url = dispatcher.base_url
    source = {"operator": "emit", "outputs": [{"index": 0, "dataset": "b"}]}
    sink = {"operator": "echo", "inputs": [{"from": {"dataset": "b"}}]}
    doc = {"jobs": {"source": source, "sink": sink}}
    assert dispatcher.api.put("/dags/pinned", json=doc).status_code in (200, 201)
    (dataset,) = dispatcher.api.get("/datasets").json()["datasets"]

    def pinned_task() -> str:
        body = {"operator": "echo", "job": {"dag_name": "pinned", "name": "sink"},
                "inputs": [{"dataset_uuid": dataset["dataset_uuid"]}]}  # fmt: skip
        return str(dispatcher.api.post("/tasks", json=body).json()["task_id"])

    first, second = pinned_task(), pinned_task()
    moved = dispatcher.api.post(f"/datasets/{dataset['dataset_uuid']}/versions", json={})
    current = moved.json()["dataset"]["current_version"]
    refused = taskplat(url, "retry", first)
    assert refused.returncode == 1 and "PinnedVersionNotCurrent" in refused.stderr
    replayed = as_json(taskplat(url, "retry", first, "--repin", "--json"))
    assert replayed["inputs"][0]["dataset_version"] == current
    skipped = taskplat(url, "dead", "replay", second, "--json")  # exit 1: one was skipped
    assert skipped.returncode == 1
    assert json.loads(skipped.stdout)["skipped"][0]["reason"] == "PinnedVersionNotCurrent"
    again = as_json(taskplat(url, "dead", "replay", second, "--repin", "--json"))
    assert again == {"replayed": [second], "skipped": []}


def test_submit_wait_shows_progress_and_ends_with_the_task(dispatcher: Dispatcher) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "taskplat.client", "submit", "echo", "--wait", "--json"],
        env=_env(dispatcher.base_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def submitted() -> list[Any]:
            tasks: list[Any] = dispatcher.api.get("/tasks").json()["tasks"]
            return tasks

        wait_for(lambda: submitted(), timeout=30, what="the submitted task")
        task_id = submitted()[0]["task_id"]
        lease = claimed(dispatcher, task_id)
        assert complete(dispatcher, lease, result={"ok": True}).status_code == 200
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert json.loads(out)["result"] == {"ok": True}
    assert f"submitted {task_id}" in err


def test_watch_exits_3_when_the_task_dies(dispatcher: Dispatcher) -> None:
    url = dispatcher.base_url
    task = as_json(taskplat(url, "submit", "echo", "--max-attempts", "1", "--json"))
    lease = claimed(dispatcher, task["task_id"])
    assert complete(dispatcher, lease, "Failed", error_message="boom").status_code == 200
    watched = taskplat(url, "watch", task["task_id"])
    assert watched.returncode == 3 and "Dead" in watched.stdout and "boom" in watched.stdout


def test_errors_are_one_line_on_stderr(dispatcher: Dispatcher, tmp_path: Path) -> None:
    url = dispatcher.base_url
    assert_one_line_error(taskplat(f"http://127.0.0.1:{free_port()}", "list"),
                          "cannot reach the dispatcher")  # fmt: skip
    assert_one_line_error(taskplat(url, "list", key="wrong-key-0123456789"), "401")
    assert_one_line_error(taskplat(url, "list", key=None), "401")
    assert_one_line_error(taskplat(url, "get", "nope"), "422", "task_id is not a valid UUID")
    assert_one_line_error(taskplat(url, "get", str(uuid4())), "404")
    assert_one_line_error(taskplat(url, "submit", "echo", "-q", "ghost"), "unknown queue")
    assert_one_line_error(taskplat(url, "submit", "echo", "--config", "{"), "--config")
    assert_one_line_error(taskplat(url, "list", "--status", "Bogus"), "Bogus")
    bad = tmp_path / "dag.yaml"
    bad.write_text("- just\n- a list\n")
    assert_one_line_error(taskplat(url, "dags", "apply", str(bad)), "mapping")
    cyclic = tmp_path / "cyclic.yaml"
    cyclic.write_text(
        "jobs:\n  a:\n    operator: echo\n    inputs: [{from: {job: a, output_index: 0}}]\n"
        "    outputs: [{index: 0, dataset: loop}]\n"
    )
    assert_one_line_error(taskplat(url, "dags", "apply", str(cyclic)), "422", "cycle")


def test_dags_apply_and_list_and_datasets_list(dispatcher: Dispatcher, tmp_path: Path) -> None:
    url = dispatcher.base_url
    doc = tmp_path / "pipeline.yaml"
    doc.write_text(
        "jobs:\n"
        "  source:\n    operator: emit\n    outputs: [{index: 0, dataset: blocks}]\n"
        "  sink:\n    operator: echo\n    inputs: [{from: {job: source, output_index: 0}}]\n"
    )
    applied = taskplat(url, "dags", "apply", str(doc))
    assert applied.returncode == 0 and "pipeline" in applied.stdout, applied.stderr
    listed = as_json(taskplat(url, "dags", "list", "--json"))
    assert [dag["dag_name"] for dag in listed["dags"]] == ["pipeline"]
    datasets = taskplat(url, "datasets", "list")
    assert datasets.returncode == 0 and "blocks" in datasets.stdout, datasets.stderr


def test_datasets_rollback(dispatcher: Dispatcher) -> None:
    url = dispatcher.base_url
    doc = {
        "jobs": {
            "source": {"operator": "emit", "outputs": [{"index": 0, "dataset": "blocks"}]},
            "sink": {"operator": "echo", "inputs": [{"from": {"dataset": "blocks"}}]},
        }
    }
    assert dispatcher.api.put("/dags/r", json=doc).status_code == 201
    blocks = dispatcher.api.get("/datasets").json()["datasets"][0]
    uuid, v1 = blocks["dataset_uuid"], blocks["current_version"]
    assert dispatcher.api.post(f"/datasets/{uuid}/versions", json={}).status_code == 201
    pinned = dispatcher.api.post("/tasks", json={
        "operator": "echo", "job": {"dag_name": "r", "name": "sink"},
        "inputs": [{"dataset_uuid": uuid}]}).json()  # fmt: skip

    human = taskplat(url, "datasets", "rollback", uuid, v1)
    assert human.returncode == 0, human.stderr
    assert human.stdout.strip() == f"{uuid} current version {v1} (1 tasks canceled)"
    assert dispatcher.api.get(f"/tasks/{pinned['task_id']}").json()["status"] == "Canceled"
    answer = as_json(taskplat(url, "datasets", "rollback", uuid, v1, "--json"))
    assert answer["canceled_tasks"] == 0 and answer["dataset"]["current_version"] == v1
    assert answer["dataset"]["versions"][0]["became_current"] == "rollback"
    assert_one_line_error(taskplat(url, "datasets", "rollback", uuid, str(uuid4())), "422")
    assert_one_line_error(taskplat(url, "datasets", "rollback", str(uuid4()), v1), "404")
