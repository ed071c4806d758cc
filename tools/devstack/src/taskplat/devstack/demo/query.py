"""The untrusted-join part of `make demo`: an untrusted job reads its two inputs, a buffered
Postgres dataset and an S3 Parquet dataset written by an upstream untrusted job, through the
query service, joins them and publishes the result.

Invariants:
- Everything goes through the public HTTP API; the join job's task pins both inputs at their
  current versions (a run with `inputs`), so its capability token names exactly those two.
- Waiting has a deadline; the result is True only when the joined rows are exactly the expected
  ones and the published report dataset holds them.
- `operators_file` adds the demo's operators to the wrapper's default ones.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml

DAG_NAME = "demo_query"
ALERTS = [
    {"block": 1, "severity": "low"},
    {"block": 2, "severity": "critical"},
    {"block": 3, "severity": "high"},
    {"block": 4, "severity": "critical"},
]
PRICES = [{"block": b, "price": b * 1.5} for b in (1, 2, 3)]
EXPECTED = [
    {"block": 2, "severity": "critical", "price": 3.0},
    {"block": 3, "severity": "high", "price": 4.5},
]
S3_LOCATION = "s3://taskplat-data/dataset/{dataset_uuid}/version/{dataset_version}/"
PIPELINE: dict[str, Any] = {
    "jobs": {
        "alerts": {
            "operator": "demo_alerts",
            "config": {"blocks": ALERTS},
            "outputs": [{"index": 0, "dataset": "demo_q_alerts", "kind": "buffered_postgres",
                         "schema": [{"name": "block", "type": "bigint"},
                                    {"name": "severity", "type": "text"}]}],
        },
        "prices": {
            "operator": "demo_prices",
            "trust": "untrusted",
            "config": {"prices": PRICES},
            "outputs": [{"index": 0, "dataset": "demo_q_prices", "kind": "s3",
                         "location": S3_LOCATION}],
        },
        "join": {
            "operator": "demo_join",
            "trust": "untrusted",
            "outputs": [{"index": 0, "dataset": "demo_q_report", "kind": "buffered_postgres",
                         "schema": [{"name": "block", "type": "bigint"},
                                    {"name": "severity", "type": "text"},
                                    {"name": "price", "type": "double precision"}]}],
        },
    }
}  # fmt: skip
OPERATORS: dict[str, dict[str, Any]] = {
    "demo_alerts": {"mode": "per-task"},
    # Untrusted operators run per task; the S3 endpoint is LocalStack's, beside SQS.
    "demo_prices": {"mode": "per-task", "env": ["SQS_ENDPOINT_URL", "AWS_REGION"]},
    "demo_join": {"mode": "per-task"},
}
POLL_SECONDS = 0.25


def operators_file(directory: Path) -> Path:
    """The wrapper's default operators plus the demo's; its path."""
    text = resources.files("taskplat.worker_wrapper").joinpath("operators.yaml").read_text()
    document = yaml.safe_load(text)
    for name, spec in OPERATORS.items():
        document["operators"][name] = {
            "command": ["{python}", "-m", "taskplat.devstack.demo.query_ops"],
            **spec,
        }
    path = directory / "operators.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _ok(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise RuntimeError(f"{response.request.method} {response.request.url.path} answered "
                           f"{response.status_code}: {response.text}")  # fmt: skip
    return response.json()


def _wait(what: str, check: Any, deadline: float) -> Any:
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def _finished(client: httpx.Client, task_id: str) -> Any:
    def done() -> Any:
        task = _ok(client.get(f"/tasks/{task_id}"))
        return task if task["status"] in ("Completed", "Failed", "Dead", "Canceled") else None

    return done


def _dataset(client: httpx.Client, name: str) -> dict[str, Any]:
    (found,) = [d for d in _ok(client.get("/datasets"))["datasets"] if d["name"] == name]
    view: dict[str, Any] = _ok(client.get(f"/datasets/{found['dataset_uuid']}"))
    return view


def _run(client: httpx.Client, job: str, body: dict[str, Any], deadline: float) -> Any:
    task = _ok(client.post(f"/dags/{DAG_NAME}/jobs/{job}/runs", json=body))
    return _wait(f"the {job} task", _finished(client, task["task_id"]), deadline)


def run_query_demo(client: httpx.Client, *, timeout: float) -> tuple[bool, str]:
    """Apply, write both inputs, run the untrusted join; (it joined right, the report)."""
    deadline = time.monotonic() + timeout
    body = yaml.safe_dump(PIPELINE, sort_keys=False).encode()
    _ok(client.put(f"/dags/{DAG_NAME}", content=body,
                   headers={"Content-Type": "application/yaml"}))  # fmt: skip
    lines = [f"untrusted join '{DAG_NAME}': alerts (buffered Postgres) + prices (S3 Parquet)"]
    # The sink creates a buffered dataset's queue when it next looks for new datasets: a write
    # before that is refused ("retry later"), and could use up the job's attempts.
    for name in ("demo_q_alerts", "demo_q_report"):
        _wait(
            f"the sink to create the buffer queue of {name}",
            lambda name=name: _dataset(client, name).get("buffer_queue_url"),
            deadline,
        )
    alerts = _run(client, "alerts", {}, deadline)
    _wait(
        "the sink to write the alerts",
        lambda: _dataset(client, "demo_q_alerts").get("row_count") == len(ALERTS),
        deadline,
    )
    prices = _run(client, "prices", {}, deadline)
    lines.append(f"  job alerts {alerts['status']}: {len(ALERTS)} rows in demo_q_alerts")
    written = (prices.get("result") or {}).get("written", prices.get("error_message"))
    lines.append(f"  job prices {prices['status']} (untrusted, broker credentials): {written}")
    pins = []
    for name in ("demo_q_alerts", "demo_q_prices"):
        view = _dataset(client, name)
        pins.append({"dataset_uuid": view["dataset_uuid"],
                     "dataset_version": view["current_version"], "cursor": 0})  # fmt: skip
    join = _run(client, "join", {"inputs": pins}, deadline)
    joined = (join.get("result") or {}).get("joined")
    lines.append(f"  job join {join['status']} (untrusted, query service): {joined}")
    ok = join["status"] == "Completed" and joined == EXPECTED
    if ok:
        _wait("the sink to write the report",
              lambda: _dataset(client, "demo_q_report").get("row_count") == len(EXPECTED),
              deadline)  # fmt: skip
        lines.append(f"  dataset demo_q_report: {len(EXPECTED)} joined rows published")
    lines.append("the untrusted operator read exactly its two inputs and joined them" if ok
                 else f"the join did not answer {EXPECTED}")  # fmt: skip
    return ok, "\n".join(lines)
