"""One operator for both runtimes of the end-to-end tests: the worker wrapper runs it as
`python -m e2e_lambda_operator` (`serve`), the Lambda endpoint as `e2e_lambda_operator.handler`
under `awslambdaric` (`taskplat_handler`).

Config: `events` (emitted as given), `forward` (one event on output 0 per input, at its
position), `crash_attempts` (exit the process on these attempts, without answering). Returns the
attempt and the positions it emitted.
"""

from __future__ import annotations

import os
from typing import Any

from taskplat.lambda_runtime import Task, emit_event, serve, taskplat_handler


def handle(task: Task) -> dict[str, Any]:
    if task.attempt in task.config.get("crash_attempts", []):
        os._exit(3)
    emitted: list[dict[str, Any]] = []
    for event in task.config.get("events", []):
        emit_event(event)
        emitted.append(dict(event))
    if task.config.get("forward"):
        for item in task.inputs:
            emit_event(output_index=0, cursor=item["cursor"])
            emitted.append({"output_index": 0, "cursor": item["cursor"]})
    return {"attempt": task.attempt, "emitted": emitted}


handler = taskplat_handler(handle)

if __name__ == "__main__":
    raise SystemExit(serve(handle))
