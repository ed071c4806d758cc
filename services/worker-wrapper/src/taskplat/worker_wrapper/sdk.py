"""The operator SDK for operators written in Python, under its worker wrapper import path.

    from taskplat.worker_wrapper.sdk import Task, emit_event, serve

    def handle(task: Task) -> dict:
        emit_event(output_index=0, cursor=42)   # the job's output 0, at its current version
        return {"rows": 42}            # the result payload; raise to fail the task

    if __name__ == "__main__":
        raise SystemExit(serve(handle))

There is one implementation, `taskplat.lambda_runtime.operator` (standard library only, cheap to
import: no HTTP machinery), which this module re-exports; the same operator also runs as a Lambda
function with `taskplat.lambda_runtime.taskplat_handler`. Its docstring states the invariants:
one envelope line per task line, stdout pointed at stderr while a handler runs, `OperatorFailure`
and `PermanentFailure` (`"retryable": false`), `step` results as `{"step": ...}` lines, and
`publish_records` lines of at most `RECORDS_LINE_BYTES`.
"""

from taskplat.lambda_runtime.operator import (
    RECORDS_LINE_BYTES,
    Handler,
    OperatorFailure,
    PermanentFailure,
    Result,
    Task,
    emit_event,
    emit_events,
    publish_records,
    read_task,
    resolve_event,
    serve,
    step,
)

__all__ = [
    "RECORDS_LINE_BYTES",
    "Handler",
    "OperatorFailure",
    "PermanentFailure",
    "Result",
    "Task",
    "emit_event",
    "emit_events",
    "publish_records",
    "read_task",
    "resolve_event",
    "serve",
    "step",
]
