"""The pipeline part of `make demo`: a three-job DAG applied, its first job triggered, and the
routing shown once every event has started its downstream jobs.

Invariants:
- Everything goes through the public HTTP API, as a user would do it (the DAG document is sent as
  YAML, the format people write).
- Waiting has a deadline; the result is True only when each job has exactly the tasks its upstream
  events call for (one per event position) and all of them Completed.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import yaml

DAG_NAME = "demo"
CURSORS = (100, 200, 300)
PIPELINE: dict[str, Any] = {
    "jobs": {
        "follow": {
            "operator": "emit",
            "config": {"events": [{"output_index": 0, "cursor": c} for c in CURSORS]},
            "outputs": [{"index": 0, "dataset": "demo_blocks"}],
        },
        "transform": {
            "operator": "emit",
            "config": {"forward": True},
            "inputs": [{"from": {"job": "follow", "output_index": 0}}],
            "outputs": [{"index": 0, "dataset": "demo_enriched"}],
        },
        "report": {
            "operator": "echo",
            "inputs": [{"from": {"dataset": "demo_enriched"}, "where": "severity > 2"}],
        },
    }
}
EXPECTED = {"follow": 1, "transform": len(CURSORS), "report": len(CURSORS)}
POLL_SECONDS = 0.25


def _ok(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.method} {response.request.url.path} answered "
                           f"{response.status_code}: {response.text}")  # fmt: skip
    return response.json()


def _job_tasks(client: httpx.Client, job: str) -> list[dict[str, Any]]:
    page = _ok(client.get("/tasks", params={"dag": DAG_NAME, "job": job, "limit": 100}))
    tasks: list[dict[str, Any]] = page["tasks"]
    return tasks


def _done(client: httpx.Client) -> bool:
    for job, count in EXPECTED.items():
        tasks = _job_tasks(client, job)
        if len(tasks) < count or any(task["status"] != "Completed" for task in tasks):
            return False
    return True


def run_pipeline_demo(client: httpx.Client, *, timeout: float) -> tuple[bool, str]:
    """Apply, trigger, wait; (every job ran as expected, the routing report)."""
    body = yaml.safe_dump(PIPELINE, sort_keys=False).encode()
    _ok(client.put(f"/dags/{DAG_NAME}", content=body,
                   headers={"Content-Type": "application/yaml"}))  # fmt: skip
    _ok(client.post(f"/dags/{DAG_NAME}/jobs/follow/runs", json={}))
    deadline = time.monotonic() + timeout
    while not _done(client) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    lines = [f"pipeline '{DAG_NAME}': follow -> transform -> report"]
    ok = True
    for job, expected in EXPECTED.items():
        tasks = _job_tasks(client, job)
        statuses = sorted({task["status"] for task in tasks})
        positions = sorted(i.get("cursor") for task in tasks for i in task["inputs"])
        lines.append(f"  job {job:<10} {len(tasks)} task(s) {'/'.join(statuses) or '-'}"
                     + (f", inputs at cursors {positions}" if positions else ""))  # fmt: skip
        ok = ok and len(tasks) == expected and statuses == ["Completed"]
    for dataset in _ok(client.get("/datasets"))["datasets"]:
        if not dataset["name"].startswith("demo_"):
            continue
        events = _ok(client.get(f"/datasets/{dataset['dataset_uuid']}/events"))["events"]
        routed = sum(1 for event in events if event["routed"])
        created = sum(len(event["tasks"]) for event in events)
        lines.append(f"  dataset {dataset['name']:<14} {len(events)} event(s), {routed} routed, "
                     f"{created} downstream task(s) started")  # fmt: skip
    lines.append("every event started each downstream job exactly once" if ok
                 else "the pipeline did not finish as expected before the deadline")  # fmt: skip
    return ok, "\n".join(lines)
