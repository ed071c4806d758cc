"""Example operator `report` (Python): the last step of the example image's three-language
pipeline (scatter in TypeScript -> square in Rust -> report). It reports the cursors of its input
events and their sum: `{"received": [...], "total": n}`.

Run by the worker wrapper as `{python} /opt/taskplat/operators/report.py` (operators.yaml).
Invariants: no external effects; an input without an integer cursor fails the task permanently.
"""

from __future__ import annotations

from taskplat.worker_wrapper.sdk import PermanentFailure, Task, serve


def handle(task: Task) -> dict[str, object]:
    cursors = [item.get("cursor") for item in task.inputs]
    if not all(isinstance(cursor, int) for cursor in cursors):
        raise PermanentFailure(f"every input needs an integer cursor, got {cursors}")
    received = sorted(int(cursor) for cursor in cursors if isinstance(cursor, int))
    return {"received": received, "total": sum(received)}


if __name__ == "__main__":
    raise SystemExit(serve(handle))
