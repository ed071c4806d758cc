"""Run a Taskplat operator as an AWS Lambda function, and the same operator under the worker
wrapper (standard library only; no server code, no worker token, no database).

    from taskplat.lambda_runtime import Task, emit_event, serve, taskplat_handler

    def handle(task: Task) -> dict:
        emit_event(output_index=0, cursor=42)
        return {"rows": 42}

    handler = taskplat_handler(handle)          # the function's handler
    if __name__ == "__main__":
        raise SystemExit(serve(handle))         # a worker wrapper operator

See `handler` for what an invocation does and `operator` for the shared operator API.
"""

from taskplat.lambda_runtime.dispatcher import Refused, Unreachable
from taskplat.lambda_runtime.handler import LeaseLost, taskplat_handler
from taskplat.lambda_runtime.operator import (
    OperatorFailure,
    Result,
    Task,
    emit_event,
    emit_events,
    resolve_event,
    run_operator,
    serve,
    step,
)

__all__ = [
    "LeaseLost",
    "OperatorFailure",
    "Refused",
    "Result",
    "Task",
    "Unreachable",
    "emit_event",
    "emit_events",
    "resolve_event",
    "run_operator",
    "serve",
    "step",
    "taskplat_handler",
]
