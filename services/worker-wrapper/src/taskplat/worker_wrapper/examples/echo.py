"""`echo`: emits each of `config.events` as an upstream event, then returns its config as the
result."""

from __future__ import annotations

from typing import Any

from taskplat.worker_wrapper.sdk import Task, emit_event, serve


def handle(task: Task) -> dict[str, Any]:
    for event in task.config.get("events") or []:
        emit_event(event)
    return task.config


if __name__ == "__main__":
    raise SystemExit(serve(handle))
