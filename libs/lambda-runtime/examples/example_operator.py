"""The example operator of the Python runtime, the same as the JavaScript and Rust ones (the
shared contract tests run all three): `python example_operator.py` serves the worker wrapper's
protocol; as a Lambda function its handler is `example_operator.handler`.

Config: `crash` (exit at once, answering nothing), `print` (a stray line on stdout),
`sleep_seconds` (then go on), `events` (emitted as given), `forward` (one event on output 0 per
input, at its cursor), `steps` (names: each step's result is the attempt that first ran it),
`query` ({sql, params, max_rows}: its answer goes in the payload), `records` ({output, records}:
published), `event_bytes` (one event on output 0 whose partition_key is that many bytes),
`fail` / `permanent` (fail with this message, permanently for the latter), `non_finite` ("nan"
or "inf": a payload holding that number). Payload: {attempt, emitted, inputs (their cursors)}
plus `steps`, `query`, `published`.
"""

from __future__ import annotations

import os
import time
from typing import Any

from taskplat.lambda_runtime import (
    PermanentFailure,
    Task,
    emit_event,
    publish_records,
    query,
    serve,
    step,
    taskplat_handler,
)


class Error(Exception):
    """A plain error (its name is the same in the three example operators)."""


def handle(task: Task) -> dict[str, Any]:
    config = task.config
    if config.get("crash"):
        os._exit(3)
    if config.get("print"):
        print(config["print"])
    if config.get("sleep_seconds"):
        time.sleep(float(config["sleep_seconds"]))
    inputs = [item.get("cursor") for item in task.inputs]
    payload: dict[str, Any] = {"attempt": task.attempt, "emitted": 0, "inputs": inputs}
    for event in config.get("events", []):
        emit_event(event)
        payload["emitted"] += 1
    if config.get("event_bytes"):
        emit_event(output_index=0, partition_key="x" * int(config["event_bytes"]))
        payload["emitted"] += 1
    if config.get("forward"):
        for item in task.inputs:
            emit_event(output_index=0, cursor=item.get("cursor"))
            payload["emitted"] += 1
    if "steps" in config:
        attempt = task.attempt
        payload["steps"] = {name: step(name, lambda: attempt) for name in config["steps"]}
    if "query" in config:
        asked = config["query"]
        answer = query(asked["sql"], asked.get("params"), max_rows=asked.get("max_rows"))
        payload["query"] = answer.as_dict()
    if "records" in config:
        records = config["records"]
        payload["published"] = publish_records(records["output"], records["records"])
    if config.get("fail"):
        raise Error(config["fail"])
    if config.get("permanent"):
        raise PermanentFailure(config["permanent"])
    if config.get("non_finite"):
        return {"ratio": float(config["non_finite"])}  # float("nan"), float("inf")
    return payload


handler = taskplat_handler(handle)

if __name__ == "__main__":
    raise SystemExit(serve(handle))
