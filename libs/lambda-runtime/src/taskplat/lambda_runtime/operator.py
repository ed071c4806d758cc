"""The Taskplat operator SDK, once for both runtimes: the worker wrapper's (JSON lines on stdin
and stdout, `serve`) and Lambda's (`taskplat_handler`). `taskplat.worker_wrapper.sdk` re-exports
this module. Standard library only and cheap to import (no HTTP machinery: that is `handler`'s).

    from taskplat.lambda_runtime import Task, emit_event, serve, taskplat_handler

    def handle(task: Task) -> dict:
        emit_event(output_index=0, cursor=42)   # the job's output 0, at its current version
        return {"rows": 42}                     # the result payload; raise to fail the task

    handler = taskplat_handler(handle)          # Lambda: the function's handler
    if __name__ == "__main__":
        raise SystemExit(serve(handle))         # worker wrapper: an `operators.yaml` command

Invariants:
  * `serve` answers every task line on stdin with exactly one envelope line on stdout, so the same
    code runs per-task (one line, then stdin closes) and pooled (a line per task, forever). A
    line that is not a task (not JSON, or not the shape of the contracts' `TaskLine` schema:
    `check_task_line`) answers a failed envelope, `malformed task line: ...`, and serving goes
    on. When stdout is closed under it (the reader went away), serving stops at once: no
    further task runs and `serve` returns 1.
  * While a handler runs under `serve`, `sys.stdout` points at stderr: a stray `print` cannot
    corrupt the protocol; only the SDK writes to the real stdout, each line flushed.
  * Events, step results and records go to the running operator's `Channel` (a context variable,
    so it follows the operator into the thread Lambda runs it in): protocol lines under `serve`,
    `/internal/events` and `/internal/steps` calls under Lambda.
  * A handler that raises fails the task with `error` = `<ExceptionType>: <message>` (traceback
    on stderr); `OperatorFailure` fails it with just its message; `PermanentFailure` fails it
    for good (`"retryable": false`: no retry, the task is Dead at once), under both runtimes; a
    result or step result that is not JSON fails it too, NaN and Infinity included (JSON has
    neither): `the result is not JSON: NaN or Infinity`.
  * An event over `EVENT_MAX_BYTES` of JSON (once resolved) fails the task before it is written.
  * `emit_event(output_index=N, ...)` fills `dataset_uuid` and `dataset_version` from the task's
    resolved output N (claimed with the task); an index the job does not have fails the task
    (`OperatorFailure`) before anything is written.
  * `task_id` is the idempotency key of external effects; `(attempt, lease_token)` is the fencing
    token.
  * `step(name, fn)` runs `fn` only when no earlier attempt of the task recorded a result for
    `name` (the claim carries those results), else returns the recorded one; a result it
    computes is recorded (a `{"step": ...}` line under `serve`, `/internal/steps` under Lambda)
    and the first recorded result of a step wins.
  * `publish_records(output, records)` writes `{"records": [...], "dataset_uuid"}` lines (at most
    `RECORDS_LINE_BYTES` each) for a buffered_postgres output of the task's job, named by its
    output index, dataset name or dataset uuid; the wrapper sends them to the dataset's buffer
    queue before it reports the task complete. Each record needs `org_id` and `dedupe_key`. It is
    the wrapper's alone: a function has no queue to publish to.
"""

from __future__ import annotations

import contextvars
import io
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO, TypeVar

from taskplat.lambda_runtime.task_line import check_task_line

T = TypeVar("T")
RECORDS_LINE_BYTES = 200_000
# The largest event, in bytes of JSON once resolved (the same in the three runtimes).
EVENT_MAX_BYTES = 16_384
NOT_FINITE = "NaN or Infinity"


class Channel(Protocol):
    """Where a running operator's events and step results go (the wrapper or the dispatcher)."""

    def events(self, events: list[dict[str, Any]]) -> None: ...

    def step(self, name: str, result: Any) -> Any:
        """Record `result` for step `name`; the result that stands (the first recorded)."""
        ...


_emitter: contextvars.ContextVar[Channel | None] = contextvars.ContextVar(
    "taskplat_channel", default=None
)
_current_task: contextvars.ContextVar[Task | None] = contextvars.ContextVar(
    "taskplat_task", default=None
)


class OperatorFailure(Exception):
    """Raise to fail the task with this message (no traceback in the error)."""


class PermanentFailure(OperatorFailure):
    """Raise to fail the task for good: it is not retried and becomes Dead at once
    (`PermanentFailure`), whatever attempts it has left. The envelope says `"retryable": false`."""


@dataclass(frozen=True)
class Task:
    task_id: str
    attempt: int
    lease_token: str
    deadline_at: str | None
    operator: str
    queue: str
    config: dict[str, Any]
    inputs: list[Any]
    job: dict[str, Any] | None
    timeout_seconds: int | None
    document: dict[str, Any] = field(repr=False)
    # The job's outputs, resolved when the task was claimed: {output_index, dataset_uuid,
    # dataset_version, location}.
    outputs: list[dict[str, Any]] = field(default_factory=list)
    # Step results earlier attempts recorded ({step: result}); `step` adds this attempt's.
    steps: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_document(cls, doc: Any) -> Task:
        """A task line of the wrapper, or a claim's `task` with `lease_token` added;
        `OperatorFailure` (`malformed task line: ...`) when it is not one."""
        problem = check_task_line(doc)
        if problem is not None:
            raise OperatorFailure(f"malformed task line: {problem}")
        return cls(
            task_id=str(doc["task_id"]),
            attempt=int(doc["attempt"]),
            lease_token=str(doc.get("lease_token", "")),
            deadline_at=doc.get("deadline_at"),
            operator=str(doc.get("operator", "")),
            queue=str(doc.get("queue", "")),
            config=dict(doc.get("config") or {}),
            inputs=list(doc.get("inputs") or []),
            job=doc.get("job"),
            timeout_seconds=doc.get("timeout_seconds"),
            document=dict(doc),
            outputs=[dict(output) for output in doc.get("outputs") or []],
            steps=dict(doc.get("steps") or {}),
        )

    def output(self, index: int) -> dict[str, Any]:
        """The resolved output `index` of the task's job."""
        for output in self.outputs:
            if output.get("output_index") == index:
                return output
        known = sorted(int(output.get("output_index", -1)) for output in self.outputs)
        raise OperatorFailure(f"the task's job has no output {index} (outputs: {known})")

    @property
    def capability_token(self) -> str | None:
        """The attempt's capability token when its job is untrusted (what it may read and write,
        for the credential broker and the query service): the claim's (a Lambda invocation's
        payload) or `TASKPLAT_CAPABILITY_TOKEN` (an operator the wrapper runs); else None."""
        value = self.document.get("capability_token") or os.environ.get("TASKPLAT_CAPABILITY_TOKEN")
        return str(value) if value else None

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context to continue (parent of the operator's own spans), if traced:
        `traceparent` of the task line (pooled) or `TRACEPARENT` (per-task)."""
        value = self.document.get("traceparent") or os.environ.get("TRACEPARENT")
        return str(value) if value else None


@dataclass(frozen=True)
class Result:
    """A full result: payload, outputs (docs/contracts.md, task-complete) and final events."""

    payload: dict[str, Any] | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


Handler = Callable[[Task], "Mapping[str, Any] | Result | None"]


def resolve_event(
    event: Mapping[str, Any] | None = None, *, task: Task | None = None, **fields: Any
) -> dict[str, Any]:
    """The event as the dispatcher takes it: an `output_index` is replaced by that output's
    `dataset_uuid` and `dataset_version` (a given `dataset_version` is kept)."""
    resolved = {**(event or {}), **fields}
    index = resolved.pop("output_index", None)
    if index is not None:
        current = task or _current_task.get()
        if current is None:
            raise OperatorFailure(
                "output_index needs the task (emit inside a handler run by serve)"
            )
        output = current.output(int(index))
        resolved = {
            "dataset_uuid": output["dataset_uuid"],
            "dataset_version": output["dataset_version"],
            **resolved,
        }
    if len(_json_text(resolved, "an event").encode()) > EVENT_MAX_BYTES:
        raise OperatorFailure(f"an event is larger than {EVENT_MAX_BYTES} bytes of JSON")
    return resolved


def _json_text(value: Any, what: str = "the result") -> str:
    """`value` as compact JSON; `OperatorFailure` when it is not JSON (NaN and Infinity are not)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        detail = NOT_FINITE if "Out of range float" in str(exc) else str(exc)
        raise OperatorFailure(f"{what} is not JSON: {detail}") from None
    except TypeError as exc:
        raise OperatorFailure(f"{what} is not JSON: {exc}") from None


def current_channel() -> Channel | None:
    """The running operator's channel (for `query`: the Lambda one holds the capability token)."""
    return _emitter.get()


def current_traceparent() -> str | None:
    """The W3C trace context of the task being served (its `traceparent`), else
    `TRACEPARENT`; None when untraced."""
    task = _current_task.get()
    if task is not None:
        return task.traceparent
    return os.environ.get("TRACEPARENT") or None


def _channel(what: str) -> Channel:
    channel = _emitter.get()
    if channel is None:
        raise OperatorFailure(f"{what} works only inside a handler run by serve or Lambda")
    return channel


def _task_of(what: str) -> Task:
    task = _current_task.get()
    if task is None:
        raise OperatorFailure(f"{what} needs the task (call it inside a handler run by serve)")
    return task


def emit_event(event: Mapping[str, Any] | None = None, **fields: Any) -> None:
    """Emit one upstream event: `dataset_uuid` and `dataset_version` (or `output_index`, an output
    of the task's job), and a `cursor` or a partition (`partition_key`, `start`, `end`)."""
    resolved = resolve_event(event, **fields)
    _channel("emitting events").events([resolved])


def emit_events(events: Iterable[Mapping[str, Any]]) -> None:
    batch = [resolve_event(event) for event in events]
    if batch:
        _channel("emitting events").events(batch)


def step(name: str, fn: Callable[[], T]) -> T:
    """The result of the task's step `name`: recorded by an earlier attempt, else `fn()`
    (recorded for later attempts). The result must be JSON."""
    task = _task_of("step")
    channel = _channel("step")
    if name in task.steps:
        stored: T = task.steps[name]
        return stored
    result = fn()
    try:
        _json_text(result)
    except OperatorFailure as exc:
        raise OperatorFailure(f"step {json.dumps(name)}: {exc}") from None
    standing: T = channel.step(name, result)
    task.steps[name] = standing
    return standing


def _buffered_output(task: Task, output: int | str) -> dict[str, Any]:
    if isinstance(output, int):
        found = task.output(output)
    else:
        matches = [o for o in task.outputs if output in (o.get("dataset"), o.get("dataset_uuid"))]
        if not matches:
            raise OperatorFailure(f"the task's job has no output dataset {output!r}")
        found = matches[0]
    if found.get("kind") != "buffered_postgres":
        raise OperatorFailure(f"output {output!r} is not a buffered_postgres dataset")
    return found


def publish_records(output: int | str, records: Iterable[Mapping[str, Any]]) -> int:
    """Publish records to a buffered_postgres output of the task's job (its output index, dataset
    name or dataset uuid); returns how many. Each record has `org_id` and `dedupe_key`."""
    target = _buffered_output(_task_of("publish_records"), output)
    channel = _channel("publish_records")
    if not isinstance(channel, _Lines):
        raise OperatorFailure("publish_records works only under the worker wrapper")
    dataset_uuid = str(target["dataset_uuid"])
    chunk: list[str] = []
    size = 0
    count = 0
    for record in records:
        text = json.dumps(dict(record), separators=(",", ":"))
        if chunk and size + len(text) + 1 > RECORDS_LINE_BYTES:
            channel.records(dataset_uuid, chunk)
            chunk, size = [], 0
        chunk.append(text)
        size += len(text) + 1
        count += 1
    if chunk:
        channel.records(dataset_uuid, chunk)
    return count


def read_task(stream: TextIO | None = None) -> Task:
    """Read one task line (for operators that do not use `serve`)."""
    line = (stream or sys.stdin).readline()
    if not line.strip():
        raise OperatorFailure("no task on stdin")
    return Task.from_document(json.loads(line))


def run_operator(handler: Handler, task: Task, emitter: Channel) -> dict[str, Any]:
    """Run `handler` on `task` with `emitter` taking its events and steps; the result envelope
    (`{"status": "succeeded", "payload", "outputs"?, "events"?}` or `{"status": "failed",
    "error", "retryable"?: false}`), never an exception. A result holding NaN or Infinity
    fails the task."""
    task_token = _current_task.set(task)
    emitter_token = _emitter.set(emitter)
    try:
        result = handler(task)
        if isinstance(result, Result):
            envelope: dict[str, Any] = {"status": "succeeded", "payload": result.payload}
            if result.outputs:
                envelope["outputs"] = result.outputs
            if result.events:
                envelope["events"] = [resolve_event(event, task=task) for event in result.events]
        else:
            payload = dict(result) if result is not None else None
            envelope = {"status": "succeeded", "payload": payload}
    except PermanentFailure as exc:
        return {"status": "failed", "retryable": False, "error": str(exc) or "operator failed"}
    except OperatorFailure as exc:
        return {"status": "failed", "error": str(exc) or "operator failed"}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        _current_task.reset(task_token)
        _emitter.reset(emitter_token)
    try:
        _json_text(envelope)
    except OperatorFailure as exc:
        return {"status": "failed", "error": str(exc)}
    return envelope


class _StreamClosed(OperatorFailure):
    """The protocol stream was closed under the operator (the reader went away)."""


class _Lines:
    """The worker wrapper's channel: one flushed JSON line on the protocol stream per call; once
    the stream is found closed, every call raises `_StreamClosed`."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.closed = False

    def _send(self, text: str) -> None:
        if self.closed:
            raise _StreamClosed("stdout is closed")
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            self.closed = True
            raise _StreamClosed("stdout is closed") from None

    def write(self, obj: Mapping[str, Any]) -> None:
        self._send(json.dumps(obj, separators=(",", ":")) + "\n")

    def events(self, events: list[dict[str, Any]]) -> None:
        self.write({"event": events[0]} if len(events) == 1 else {"events": events})

    def step(self, name: str, result: Any) -> Any:
        self.write({"step": {"name": name, "result": result}})
        return result

    def records(self, dataset_uuid: str, chunk: list[str]) -> None:
        self._send('{"dataset_uuid":"' + dataset_uuid + '","records":[' + ",".join(chunk) + "]}\n")


def serve(handler: Handler, *, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """The worker wrapper's side: answer each task line of stdin with one envelope line; return 0
    when stdin closes."""
    source = stdin or sys.stdin
    out = stdout or sys.stdout
    lines = _Lines(out)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        for line in source:
            if not line.strip():
                continue
            try:
                task = Task.from_document(json.loads(line))
            except ValueError as exc:  # not JSON
                envelope = {"status": "failed", "error": f"malformed task line: {exc}"}
            except OperatorFailure as exc:
                envelope = {"status": "failed", "error": str(exc)}
            else:
                envelope = run_operator(handler, task, lines)
            lines.write(envelope)
    except _StreamClosed:
        print("taskplat: stdout is closed: serving stops", file=sys.stderr)
        _discard(out)
        return 1
    finally:
        sys.stdout = real_stdout
    return 0


def _discard(out: TextIO) -> None:
    """Point the closed protocol stream at /dev/null, so what it still buffers is not flushed
    into the closed pipe again at exit (Python would report it and exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass
