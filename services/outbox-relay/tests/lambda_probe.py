"""The operator of the Lambda tests, one function for both runtimes: `handler` for Lambda (run
by `awslambdaric` in `LocalLambda`), `serve` for the worker wrapper.

Config: `marker` (a file: one line `<task_id> <attempt>` appended per run that reached the end),
`fail` (fail with OperatorFailure), `permanent` (fail for good with PermanentFailure),
`fail_attempts` (fail on these attempts), `crash_attempts` (exit the process on these attempts,
without answering), `seconds` (sleep first), `events` (emitted one by one), `step` (record step
`first` = this attempt before anything else), `report_capability` (return the capability token
the operator got). Returns `{"attempt": N}` (and `first`, the step's standing result, with `step`;
`capability_token` with `report_capability`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from taskplat.lambda_runtime import (
    OperatorFailure,
    PermanentFailure,
    Task,
    emit_event,
    serve,
    step,
    taskplat_handler,
)


def handle(task: Task) -> dict[str, Any]:
    config = task.config
    if task.attempt in config.get("crash_attempts", []):
        os._exit(3)
    first = step("first", lambda: task.attempt) if config.get("step") else None
    time.sleep(float(config.get("seconds", 0)))
    if config.get("permanent"):
        raise PermanentFailure(f"never again (attempt {task.attempt})")
    if config.get("fail") or task.attempt in config.get("fail_attempts", []):
        raise OperatorFailure(f"asked to fail attempt {task.attempt}")
    for event in config.get("events", []):
        emit_event(event)
    if config.get("marker"):
        with open(config["marker"], "a", encoding="utf-8") as marker:
            marker.write(f"{task.task_id} {task.attempt}\n")
    answer = {"attempt": task.attempt} | ({"first": first} if config.get("step") else {})
    if config.get("report_capability"):
        answer["capability_token"] = task.capability_token
    return answer


handler = taskplat_handler(handle)

if __name__ == "__main__":
    raise SystemExit(serve(handle))
