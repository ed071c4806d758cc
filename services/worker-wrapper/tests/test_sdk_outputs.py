"""The SDK fills an event's dataset and version from the task's resolved outputs
(`output_index=`), the `emit` example operator emits configured and forwarded events, and
`PermanentFailure` fails a task for good."""

from __future__ import annotations

import io
import json
from typing import Any

from taskplat.worker_wrapper.examples import emit
from taskplat.worker_wrapper.sdk import OperatorFailure, PermanentFailure, emit_event, serve

OUT0 = {"output_index": 0, "dataset_uuid": "d0", "dataset_version": "v0", "location": "l0"}
OUT1 = {"output_index": 1, "dataset_uuid": "d1", "dataset_version": "v1", "location": "l1"}


def run(handler: Any, **task: Any) -> list[dict[str, Any]]:
    doc = {
        "task_id": "t",
        "attempt": 1,
        "lease_token": "l",
        "operator": "op",
        "queue": "default",
        "config": {},
        "inputs": [],
        "job": None,
        "timeout_seconds": None,
        "deadline_at": None,
        "outputs": [OUT0, OUT1],
        **task,
    }
    out = io.StringIO()
    assert serve(handler, stdin=io.StringIO(json.dumps(doc) + "\n"), stdout=out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_output_index_resolves_to_the_output_dataset_and_version() -> None:
    def handler(task: Any) -> dict[str, Any]:
        emit_event(output_index=1, cursor=5)
        emit_event({"output_index": 0, "start": 1, "end": 2, "dataset_version": "pinned"})
        return {}

    lines = run(handler)
    assert lines[0] == {"event": {"dataset_uuid": "d1", "dataset_version": "v1", "cursor": 5}}
    assert lines[1] == {
        "event": {"dataset_uuid": "d0", "dataset_version": "pinned", "start": 1, "end": 2}
    }
    assert lines[2]["status"] == "succeeded"


def test_an_unknown_output_index_fails_the_task_and_emits_nothing() -> None:
    def handler(task: Any) -> dict[str, Any]:
        emit_event(output_index=7, cursor=1)
        return {}

    lines = run(handler)
    assert lines == [
        {"status": "failed", "error": "the task's job has no output 7 (outputs: [0, 1])"}
    ]


def test_emit_emits_configured_events_and_forwards_inputs() -> None:
    inputs = [
        {"dataset_uuid": "up", "dataset_version": "uv", "cursor": 9},
        {"dataset_uuid": "up", "dataset_version": "uv", "partition_key": "1-4", "start": 1,
         "end": 4, "where": "x"},
    ]  # fmt: skip
    config = {"events": [{"output_index": 1, "cursor": 3}], "forward": True}
    lines = run(emit.handle, config=config, inputs=inputs)
    events = [line["event"] for line in lines[:-1]]
    assert events == [
        {"dataset_uuid": "d1", "dataset_version": "v1", "cursor": 3},
        {"dataset_uuid": "d0", "dataset_version": "v0", "cursor": 9},
        {"dataset_uuid": "d0", "dataset_version": "v0", "partition_key": "1-4", "start": 1,
         "end": 4},
    ]  # fmt: skip
    assert lines[-1]["status"] == "succeeded" and len(lines[-1]["payload"]["emitted"]) == 3


def test_a_permanent_failure_says_the_task_must_not_be_retried() -> None:
    def permanent(task: Any) -> dict[str, Any]:
        raise PermanentFailure("the invoice was already refunded")

    def transient(task: Any) -> dict[str, Any]:
        raise OperatorFailure("try again")

    assert run(permanent) == [
        {"status": "failed", "retryable": False, "error": "the invoice was already refunded"}
    ]
    assert run(transient) == [{"status": "failed", "error": "try again"}]
