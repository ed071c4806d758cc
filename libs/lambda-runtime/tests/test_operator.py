"""The shared operator API under the worker wrapper's protocol (`serve`): one envelope line per
task line, events as protocol lines resolved from the task's outputs, failures as envelopes, and
`print` kept off the protocol; the same function is the Lambda handler's operator."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import pytest

from taskplat.lambda_runtime import (
    EVENT_MAX_BYTES,
    OperatorFailure,
    PermanentFailure,
    Result,
    Task,
    emit_event,
    publish_records,
    resolve_event,
    run_operator,
    serve,
    step,
)

OUTPUT = {"output_index": 0, "dataset_uuid": "d-1", "dataset_version": "v-1", "location": "x"}


def line(**fields: Any) -> str:
    doc = {
        "task_id": "t-1",
        "attempt": 2,
        "lease_token": "l-1",
        "operator": "op",
        "queue": "default",
        "config": {},
        "inputs": [],
        "job": None,
        "timeout_seconds": None,
        "deadline_at": None,
        "outputs": [OUTPUT],
    }
    return json.dumps({**doc, **fields}) + "\n"


def handle(task: Task) -> dict[str, Any] | Result:
    print("stray output")  # must not reach the protocol
    if task.config.get("step"):
        return {"first": step("first", lambda: task.attempt)}
    if task.config.get("fail"):
        raise OperatorFailure("asked to fail")
    if task.config.get("boom"):
        raise ValueError("boom")
    emit_event(output_index=0, cursor=task.attempt)
    if task.config.get("full"):
        return Result(payload={"n": 1}, events=[{"output_index": 0, "cursor": 9}])
    return {"attempt": task.attempt}


def answers(*lines: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    assert serve(handle, stdin=io.StringIO("".join(lines)), stdout=out) == 0
    return [json.loads(each) for each in out.getvalue().splitlines()]


def test_serve_speaks_the_wrapper_protocol() -> None:
    event = {"event": {"dataset_uuid": "d-1", "dataset_version": "v-1", "cursor": 2}}
    assert answers(line(), "\n", line(config={"fail": True})) == [
        event,
        {"status": "succeeded", "payload": {"attempt": 2}},
        {"status": "failed", "error": "asked to fail"},
    ]
    [_, full] = answers(line(config={"full": True}))
    assert full["events"] == [{"dataset_uuid": "d-1", "dataset_version": "v-1", "cursor": 9}]
    assert answers(line(config={"boom": True})) == [
        {"status": "failed", "error": "ValueError: boom"}
    ]


class Recorder:
    def __init__(self) -> None:
        self.seen: list[list[dict[str, Any]]] = []
        self.steps: dict[str, Any] = {}

    def events(self, events: list[dict[str, Any]]) -> None:
        self.seen.append(events)

    def step(self, name: str, result: Any) -> Any:
        return self.steps.setdefault(name, result)


def test_steps_are_recorded_once_and_reused_by_later_attempts() -> None:
    assert answers(line(config={"step": True})) == [
        {"step": {"name": "first", "result": 2}},
        {"status": "succeeded", "payload": {"first": 2}},
    ]
    later = line(attempt=3, config={"step": True}, steps={"first": 2})
    channel = Recorder()
    assert run_operator(handle, Task.from_document(json.loads(later)), channel)["payload"] == {
        "first": 2
    }
    assert channel.steps == {}  # a recorded step is neither run nor recorded again


def test_run_operator_hands_events_to_its_channel_and_never_raises() -> None:
    channel = Recorder()
    task = Task.from_document(json.loads(line()))
    assert run_operator(handle, task, channel) == {"status": "succeeded", "payload": {"attempt": 2}}
    assert channel.seen == [[{"dataset_uuid": "d-1", "dataset_version": "v-1", "cursor": 2}]]
    missing = run_operator(lambda t: resolve_event(output_index=5, task=t), task, channel)
    assert missing == {"status": "failed", "error": "the task's job has no output 5 (outputs: [0])"}
    with pytest.raises(OperatorFailure):
        emit_event(cursor=1)  # outside a running handler


def test_a_permanent_failure_says_not_retryable_and_records_are_the_wrappers_alone() -> None:
    class Channel:
        def events(self, events: list[dict[str, Any]]) -> None: ...

        def step(self, name: str, result: Any) -> Any:
            return result

    def permanent(task: Task) -> None:
        raise PermanentFailure("never again")

    def publish(task: Task) -> None:
        publish_records(0, [{"org_id": "o", "dedupe_key": "k"}])

    task = Task.from_document(json.loads(line(outputs=[{**OUTPUT, "kind": "buffered_postgres"}])))
    assert run_operator(permanent, task, Channel()) == {
        "status": "failed",
        "retryable": False,
        "error": "never again",
    }
    assert run_operator(publish, task, Channel()) == {
        "status": "failed",
        "error": "publish_records works only under the worker wrapper",
    }


def test_importing_the_sdk_loads_no_http_machinery() -> None:
    code = "import sys, taskplat.lambda_runtime; print('urllib.request' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_edges_fail_the_task_and_serving_goes_on() -> None:
    def edges(task: Task) -> dict[str, Any]:
        if task.config.get("big"):
            emit_event(output_index=0, partition_key="x" * EVENT_MAX_BYTES)
        if task.config.get("nan"):
            return {"ratio": float("nan")}
        return {"attempt": task.attempt}

    out = io.StringIO()
    lines = ["not json\n", "[1]\n", '{"task_id": "t"}\n', line(attempt=1.5)]
    lines += [line(config={"big": True}), line(config={"nan": True}), line()]
    assert serve(edges, stdin=io.StringIO("".join(lines)), stdout=out) == 0
    answered = [json.loads(each) for each in out.getvalue().splitlines()]
    assert [each["status"] for each in answered[:4]] == ["failed"] * 4
    assert all(each["error"].startswith("malformed task line: ") for each in answered[:4])
    assert answered[3]["error"] == "malformed task line: attempt must be an integer"
    assert answered[4:] == [
        {"status": "failed", "error": f"an event is larger than {EVENT_MAX_BYTES} bytes of JSON"},
        {"status": "failed", "error": "the result is not JSON: NaN or Infinity"},
        {"status": "succeeded", "payload": {"attempt": 2}},
    ]


def test_a_non_finite_step_result_fails_the_task_unrecorded() -> None:
    channel = Recorder()
    task = Task.from_document(json.loads(line()))
    envelope = run_operator(lambda t: {"s": step("s", lambda: float("inf"))}, task, channel)
    assert envelope == {
        "status": "failed",
        "error": 'step "s": the result is not JSON: NaN or Infinity',
    }
    assert channel.steps == {}
