"""Run a Taskplat operator as an AWS Lambda function, and the same operator under the worker
wrapper (standard library only; no server code, no worker token, no database).

    from taskplat.lambda_runtime import Task, emit_event, serve, taskplat_handler

    def handle(task: Task) -> dict:
        emit_event(output_index=0, cursor=42)
        return {"rows": 42}

    handler = taskplat_handler(handle)          # the function's handler
    if __name__ == "__main__":
        raise SystemExit(serve(handle))         # a worker wrapper operator

See `handler` for what an invocation does, `operator` for the operator SDK (which
`taskplat.worker_wrapper.sdk` re-exports) and `query_client` for reading the task's datasets
through the Query Service. Importing this package is cheap: the Lambda side (`handler`,
`dispatcher`, `query_client`, with urllib) is imported on first use of one of its names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taskplat.lambda_runtime.operator import (
    EVENT_MAX_BYTES,
    RECORDS_LINE_BYTES,
    OperatorFailure,
    PermanentFailure,
    Result,
    Task,
    emit_event,
    emit_events,
    publish_records,
    read_task,
    resolve_event,
    run_operator,
    serve,
    step,
)
from taskplat.lambda_runtime.task_line import check_task_line

if TYPE_CHECKING:
    from taskplat.lambda_runtime.dispatcher import Refused, Unreachable
    from taskplat.lambda_runtime.handler import LeaseLost, taskplat_handler
    from taskplat.lambda_runtime.query_client import QueryError, QueryResult, query, query_bytes

_LAZY = {
    "Refused": "taskplat.lambda_runtime.dispatcher",
    "Unreachable": "taskplat.lambda_runtime.dispatcher",
    "LeaseLost": "taskplat.lambda_runtime.handler",
    "taskplat_handler": "taskplat.lambda_runtime.handler",
    "QueryError": "taskplat.lambda_runtime.query_client",
    "QueryResult": "taskplat.lambda_runtime.query_client",
    "query": "taskplat.lambda_runtime.query_client",
    "query_bytes": "taskplat.lambda_runtime.query_client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "EVENT_MAX_BYTES",
    "RECORDS_LINE_BYTES",
    "LeaseLost",
    "OperatorFailure",
    "PermanentFailure",
    "QueryError",
    "QueryResult",
    "Refused",
    "Result",
    "Task",
    "Unreachable",
    "check_task_line",
    "emit_event",
    "emit_events",
    "publish_records",
    "query",
    "query_bytes",
    "read_task",
    "resolve_event",
    "run_operator",
    "serve",
    "step",
    "taskplat_handler",
]
