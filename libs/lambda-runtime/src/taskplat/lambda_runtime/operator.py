"""One operator function for both runtimes: the worker wrapper's (JSON lines on stdin and stdout)
and Lambda's (`taskplat_handler`).

    from taskplat.lambda_runtime import Task, emit_event, serve, taskplat_handler

    def handle(task: Task) -> dict:
        emit_event(output_index=0, cursor=42)   # the job's output 0, at its current version
        return {"rows": 42}                     # the result payload; raise to fail the task

    handler = taskplat_handler(handle)          # Lambda: the function's handler
    if __name__ == "__main__":
        raise SystemExit(serve(handle))         # worker wrapper: an `operators.yaml` command

Invariants (the same as the wrapper's `sdk`, whose protocol `serve` speaks):
  * `serve` answers every task line on stdin with exactly one envelope line on stdout; while a
    handler runs, `sys.stdout` points at stderr, so a stray `print` cannot corrupt the protocol;
  * `emit_event` goes to whatever runs the operator: a protocol line under `serve`, an
    `/internal/events` call under Lambda (the emitter is a context variable, so it follows the
    operator into the thread Lambda runs it in);
  * a handler that raises fails the task with `<ExceptionType>: <message>`; `OperatorFailure`
    fails it with just its message; a result that is not JSON fails it too;
  * `emit_event(output_index=N, ...)` fills `dataset_uuid`/`dataset_version` from the task's
    resolved output N; an index the job does not have fails the task before anything is sent;
  * `step(name, fn)` returns the result an earlier attempt recorded for `name` (claimed with the
    task), else runs `fn` and records its result (a `step` line under `serve`, `/internal/steps`
    under Lambda, where the first recorded result wins and is returned).
  * `publish_records` (buffered datasets) is the wrapper's alone: a function has no queue to
    publish to.
Standard library only: a function package needs nothing else.
"""

from __future__ import annotations

import contextvars
import json
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO, TypeVar


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
    outputs: list[dict[str, Any]] = field(default_factory=list)
    # Step results earlier attempts recorded ({step: result}); `step` adds this attempt's.
    steps: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> Task:
        """A task line of the wrapper, or a claim's `task` with `lease_token` added."""
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


@dataclass(frozen=True)
class Result:
    """A full result: payload, outputs (seed 004 shape) and final events."""

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
    if index is None:
        return resolved
    current = task or _current_task.get()
    if current is None:
        raise OperatorFailure("output_index needs the task (emit inside a running handler)")
    output = current.output(int(index))
    resolved.setdefault("dataset_uuid", output["dataset_uuid"])
    resolved.setdefault("dataset_version", output["dataset_version"])
    return resolved


def _channel(what: str) -> Channel:
    channel = _emitter.get()
    if channel is None:
        raise OperatorFailure(f"{what} works only inside a handler run by serve or Lambda")
    return channel


def _emit(events: list[dict[str, Any]]) -> None:
    _channel("emitting events").events(events)


T = TypeVar("T")


def step(name: str, fn: Callable[[], T]) -> T:
    """The result of the task's step `name`: recorded by an earlier attempt, else `fn()`
    (recorded for later attempts). The result must be JSON."""
    task = _current_task.get()
    channel = _channel("step")
    if task is None:
        raise OperatorFailure("step needs the task (call it inside a running handler)")
    if name in task.steps:
        stored: T = task.steps[name]
        return stored
    result = fn()
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OperatorFailure(f"step {name!r}: the result is not JSON: {exc}") from None
    standing: T = channel.step(name, result)
    task.steps[name] = standing
    return standing


def emit_event(event: Mapping[str, Any] | None = None, **fields: Any) -> None:
    """Emit one upstream event: `dataset_uuid` and `dataset_version` (or `output_index`, an output
    of the task's job), and a `cursor` or a partition (`partition_key`, `start`, `end`)."""
    _emit([resolve_event(event, **fields)])


def emit_events(events: Iterable[Mapping[str, Any]]) -> None:
    batch = [resolve_event(event) for event in events]
    if batch:
        _emit(batch)


def run_operator(handler: Handler, task: Task, emitter: Channel) -> dict[str, Any]:
    """Run `handler` on `task` with `emitter` taking its events and steps; the result envelope
    (`{"status": "succeeded", "payload", "outputs"?, "events"?}` or `{"status": "failed",
    "error"}`), never an exception."""
    task_token = _current_task.set(task)
    emitter_token = _emitter.set(emitter)
    try:
        result = handler(task)
    except OperatorFailure as exc:
        return {"status": "failed", "error": str(exc) or "operator failed"}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        _current_task.reset(task_token)
        _emitter.reset(emitter_token)
    if isinstance(result, Result):
        envelope: dict[str, Any] = {"status": "succeeded", "payload": result.payload}
        if result.outputs:
            envelope["outputs"] = result.outputs
        if result.events:
            envelope["events"] = [resolve_event(event, task=task) for event in result.events]
    else:
        envelope = {"status": "succeeded", "payload": dict(result) if result is not None else None}
    try:
        json.dumps(envelope, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return {"status": "failed", "error": f"result is not JSON: {exc}"}
    return envelope


def serve(handler: Handler, *, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """The worker wrapper's side: answer each task line of stdin with one envelope line; return 0
    when stdin closes."""
    source = stdin or sys.stdin
    out = stdout or sys.stdout

    def write(obj: Mapping[str, Any]) -> None:
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    class Lines:
        def events(self, events: list[dict[str, Any]]) -> None:
            write({"event": events[0]} if len(events) == 1 else {"events": events})

        def step(self, name: str, result: Any) -> Any:
            write({"step": {"name": name, "result": result}})
            return result

    emitter = Lines()

    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        for line in source:
            if not line.strip():
                continue
            task = Task.from_document(json.loads(line))
            write(run_operator(handler, task, emitter))
    finally:
        sys.stdout = real_stdout
    return 0
