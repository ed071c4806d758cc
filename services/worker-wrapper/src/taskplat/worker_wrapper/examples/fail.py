"""`fail`: fails while `attempt <= config.times` (default 1), then succeeds."""

from __future__ import annotations

from typing import Any

from taskplat.worker_wrapper.sdk import OperatorFailure, Task, serve


def handle(task: Task) -> dict[str, Any]:
    times = int(task.config.get("times", 1))
    if task.attempt <= times:
        raise OperatorFailure(f"failing on purpose: attempt {task.attempt} <= times {times}")
    return {"attempt": task.attempt}


if __name__ == "__main__":
    raise SystemExit(serve(handle))
