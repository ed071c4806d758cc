"""The example worker image (deploy/worker-example) as a product team runs it: its own worker pool
on its own task queue, from the image `make images` built.

- A three-language pipeline: `scatter` (TypeScript) emits one event per number, `square` (Rust)
  one event per input at the square of its cursor, `report` (Python) sums what it received; each
  event reaches the next job exactly once and every result is the expected one.
- An untrusted query: `word-count` publishes word counts to a buffered Postgres dataset, and
  `top-words`, in a job marked `trust: untrusted`, reads them through the query service container
  with its capability token, running as the image's second user (uid 10002).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from images_support import EXAMPLE_QUEUE

from taskplat.devstack.images.stack import ImageStack
from taskplat.devstack.waiting import wait_for

NUMBERS = [2, 3, 5]
OPERATOR_UID = 10002  # taskplat-operator, the worker base's second user
TEXT = "the cat saw the dog and the cat ran"
TERMINAL = ("Completed", "Failed", "Dead", "Canceled")


def _ok(response: httpx.Response) -> Any:
    assert response.status_code < 400, f"{response.request.url.path}: {response.text}"
    return response.json()


def _job_tasks(api: httpx.Client, dag: str, job: str) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = _ok(api.get("/tasks", params={"dag": dag, "job": job}))["tasks"]
    return tasks


def _finished(api: httpx.Client, dag: str, job: str, count: int) -> list[dict[str, Any]]:
    def done() -> bool:
        tasks = _job_tasks(api, dag, job)
        return len(tasks) >= count and all(t["status"] in TERMINAL for t in tasks)

    wait_for(done, timeout=120, what=f"{count} finished {job} tasks", interval=0.5)
    tasks = _job_tasks(api, dag, job)
    return [_ok(api.get(f"/tasks/{task['task_id']}")) for task in tasks]


def _dataset(api: httpx.Client, name: str) -> dict[str, Any]:
    (found,) = [d for d in _ok(api.get("/datasets"))["datasets"] if d["name"] == name]
    view: dict[str, Any] = _ok(api.get(f"/datasets/{found['dataset_uuid']}"))
    return view


def _wait_task(api: httpx.Client, task_id: str) -> dict[str, Any]:
    def task() -> dict[str, Any]:
        found: dict[str, Any] = _ok(api.get(f"/tasks/{task_id}"))
        return found

    wait_for(
        lambda: task()["status"] in TERMINAL, timeout=120, what=f"task {task_id}", interval=0.5
    )
    return task()


def test_the_three_language_pipeline_runs_on_the_example_image(
    image_stack: ImageStack, api: httpx.Client
) -> None:
    name = f"example_chain_{int(time.time())}"
    job = {"queue": EXAMPLE_QUEUE}
    dag = {
        "jobs": {
            "scatter": {**job, "operator": "scatter", "config": {"numbers": NUMBERS},
                        "outputs": [{"index": 0, "dataset": f"{name}_numbers"}]},
            "square": {**job, "operator": "square",
                       "inputs": [{"from": {"job": "scatter", "output_index": 0}}],
                       "outputs": [{"index": 0, "dataset": f"{name}_squares"}]},
            "report": {**job, "operator": "report",
                       "inputs": [{"from": {"job": "square", "output_index": 0}}]},
        }
    }  # fmt: skip
    _ok(api.put(f"/dags/{name}", json=dag))
    emit = _ok(api.post(f"/dags/{name}/jobs/scatter/runs", json={}))
    scattered = _wait_task(api, emit["task_id"])
    assert scattered["status"] == "Completed", scattered
    assert scattered["result"] == {"emitted": len(NUMBERS)}

    squares = _finished(api, name, "square", len(NUMBERS))
    reports = _finished(api, name, "report", len(NUMBERS))
    assert [t["status"] for t in squares + reports] == ["Completed"] * 2 * len(NUMBERS), (
        squares + reports
    )
    assert sorted(t["result"]["squares"][0] for t in squares) == [n * n for n in NUMBERS]
    assert all(len(t["result"]["squares"]) == 1 for t in squares), squares
    received = sorted(t["result"]["received"][0] for t in reports)
    assert received == [n * n for n in NUMBERS]
    assert all(t["result"]["total"] == t["result"]["received"][0] for t in reports), reports
    # Exactly once: each event created exactly one task of the next job, nothing more after.
    for dataset, cursors in ((f"{name}_numbers", NUMBERS), (f"{name}_squares", received)):
        events = _ok(api.get(f"/datasets/{_dataset(api, dataset)['dataset_uuid']}/events"))
        assert sorted(e["cursor"] for e in events["events"]) == sorted(cursors)
        assert all(e["routed"] and len(e["tasks"]) == 1 for e in events["events"]), events
    assert len(_job_tasks(api, name, "report")) == len(NUMBERS)
    # On the example pool's queue (the base workers hold none of these operators).
    assert {t["queue"] for t in [scattered, *squares, *reports]} == {EXAMPLE_QUEUE}


def test_an_untrusted_operator_reads_its_inputs_through_the_query_service(
    image_stack: ImageStack, api: httpx.Client
) -> None:
    limit = 2
    name = f"example_words_{int(time.time())}"
    words = f"{name}_counts"
    job = {"queue": EXAMPLE_QUEUE}
    dag = {
        "jobs": {
            "count": {**job, "operator": "word-count", "config": {"text": TEXT},
                      "outputs": [{"index": 0, "dataset": words, "kind": "buffered_postgres",
                                   "schema": [{"name": "word", "type": "text"},
                                              {"name": "n", "type": "bigint"}]}]},
            "top": {**job, "operator": "top-words", "trust": "untrusted",
                    "config": {"limit": limit}},
        }
    }  # fmt: skip
    _ok(api.put(f"/dags/{name}", json=dag))
    # The sink creates a buffered dataset's queue when it next looks for new datasets; a write
    # before that is refused.
    wait_for(
        lambda: _dataset(api, words).get("buffer_queue_url"),
        timeout=120,
        what="the buffer queue of the word counts",
        interval=0.5,
    )
    counted = _wait_task(api, _ok(api.post(f"/dags/{name}/jobs/count/runs", json={}))["task_id"])
    assert counted["status"] == "Completed", counted
    distinct = len(set(TEXT.split()))
    assert counted["result"]["distinct"] == distinct
    wait_for(
        lambda: _dataset(api, words).get("row_count") == distinct,
        timeout=120,
        what="the sink to write the word counts",
        interval=0.5,
    )
    view = _dataset(api, words)
    pin = {"dataset_uuid": view["dataset_uuid"], "dataset_version": view["current_version"]}
    top = _wait_task(
        api,
        _ok(api.post(f"/dags/{name}/jobs/top/runs", json={"inputs": [{**pin, "cursor": 0}]}))[
            "task_id"
        ],
    )
    assert top["status"] == "Completed", json.dumps(top, indent=1)
    assert top["result"] == {
        "uid": OPERATOR_UID,
        "top": [{"word": "the", "n": 3}, {"word": "cat", "n": 2}],
    }, top
    assert top["queue"] == EXAMPLE_QUEUE
