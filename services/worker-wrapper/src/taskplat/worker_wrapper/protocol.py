"""The stdout protocol of an operator: JSON lines.

  * `{"event": {...}}` or `{"events": [...]}`: upstream events (docs/contracts.md, "Events and
    routing"), forwarded to the dispatcher at once, in order;
  * `{"step": {"name": ..., "result": ...}}`: a step's result to record (`POST /internal/steps`),
    forwarded at once, in order with the events;
  * `{"records": [...], "dataset_uuid": ...}`: records for a buffered_postgres output of the job,
    published to its buffer queue before the completion is reported;
  * `{"status": "succeeded", "payload": {...}, "outputs": [...]}`: the result envelope, the last
    line of a task's answer (`events` may carry final events; `error` explains a non-success
    status; `"retryable": false` on a failure fails the task for good);
  * anything else (a non-JSON line, JSON without those keys) is ignored.

Invariants: a line that names `event`/`events`/`step`/`records`/`status` but does not match its
shape is a protocol
error, never silently ignored; a line over `line_max_bytes` or more than `total_max_bytes` of stdout
for one task is a stdout flood. Both end the operator process (the caller kills it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from taskplat.common.contracts import Event, Output
from taskplat.common.contracts.base import JsonArray, JsonObject, JsonValue
from taskplat.common.contracts.internal import StepName
from taskplat.common.logging import get_logger
from taskplat.worker_wrapper.operators import summarize

SUCCEEDED = "succeeded"
READ_CHUNK = 64 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResultEnvelope(_Strict):
    status: str = Field(min_length=1, max_length=64)
    # The same storable-JSON rule as the completion contract: no NaN/Infinity, no NUL characters.
    payload: JsonObject | None = None
    outputs: list[Output] = Field(default_factory=list, max_length=1000)
    events: list[Event] = Field(default_factory=list, max_length=1000)
    error: str | None = None
    # With a failed status: false fails the task for good (no retry; Dead at once).
    retryable: bool = True

    @property
    def succeeded(self) -> bool:
        return self.status == SUCCEEDED


class EventLine(_Strict):
    event: Event


class EventsLine(_Strict):
    events: list[Event] = Field(min_length=1, max_length=1000)


class StepResult(_Strict):
    name: StepName
    result: JsonValue = None


class StepLine(_Strict):
    step: StepResult


class RecordsLine(_Strict):
    dataset_uuid: UUID
    records: JsonArray = Field(min_length=1, max_length=100_000)


# What an operator's line asks of the wrapper while it runs, in order.
SideLine = Sequence[Event] | StepLine | RecordsLine
EventSink = Callable[[SideLine], Awaitable[None]]


@dataclass(frozen=True)
class ProtocolError:
    """The operator broke the protocol (flood, malformed event or envelope): kill it."""

    message: str


@dataclass(frozen=True)
class EndOfOutput:
    """stdout closed before a result envelope arrived."""


Answer = ResultEnvelope | ProtocolError | EndOfOutput
Line = ResultEnvelope | list[Event] | StepLine | RecordsLine | ProtocolError | None


def parse_line(raw: bytes) -> Line:
    """Classify one stdout line: an envelope, events, a protocol error, or None (ignored)."""
    text = raw.strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    if "status" in obj:
        try:
            return ResultEnvelope.model_validate(obj)
        except ValidationError as exc:
            return ProtocolError(f"invalid result envelope: {summarize(exc)}")
    if "event" in obj:
        try:
            return [EventLine.model_validate(obj).event]
        except ValidationError as exc:
            return ProtocolError(f"invalid event line: {summarize(exc)}")
    if "events" in obj:
        try:
            return list(EventsLine.model_validate(obj).events)
        except ValidationError as exc:
            return ProtocolError(f"invalid event line: {summarize(exc)}")
    if "step" in obj:
        try:
            return StepLine.model_validate(obj)
        except ValidationError as exc:
            return ProtocolError(f"invalid step line: {summarize(exc)}")
    if "records" in obj:
        try:
            return RecordsLine.model_validate(obj)
        except ValidationError as exc:
            return ProtocolError(f"invalid records line: {summarize(exc)}")
    return None


@dataclass(frozen=True)
class StdoutLimits:
    line_max_bytes: int
    total_max_bytes: int


class StdoutBudget:
    """Counts one task's stdout bytes against the flood cap."""

    def __init__(self, limits: StdoutLimits) -> None:
        self.limits = limits
        self.used = 0

    def spend(self, size: int) -> ProtocolError | None:
        self.used += size
        if self.used > self.limits.total_max_bytes:
            return ProtocolError(
                f"stdout flood: more than {self.limits.total_max_bytes} bytes of output"
            )
        return None


async def read_answer(
    stdout: asyncio.StreamReader, budget: StdoutBudget, forward: EventSink
) -> Answer:
    """Read lines until a result envelope, a protocol error or the end of stdout; forward each
    event line (awaiting the sink, so events keep their order) as it is read."""
    log = get_logger()
    while True:
        try:
            raw = await stdout.readline()
        except ValueError:  # the StreamReader limit: a line longer than line_max_bytes
            return ProtocolError(
                f"stdout flood: a line longer than {budget.limits.line_max_bytes} bytes"
            )
        if not raw:
            return EndOfOutput()
        flood = budget.spend(len(raw))
        if flood is not None:
            return flood
        if len(raw) > budget.limits.line_max_bytes:
            return ProtocolError(
                f"stdout flood: a line longer than {budget.limits.line_max_bytes} bytes"
            )
        parsed = parse_line(raw)
        if parsed is None:
            log.debug("operator_output_ignored", line=raw[:200].decode("utf-8", "replace"))
        elif isinstance(parsed, list | StepLine | RecordsLine):
            await forward(parsed)
        else:
            return parsed


async def discard_until_eof(
    stdout: asyncio.StreamReader, budget: StdoutBudget
) -> ProtocolError | None:
    """Consume what follows the envelope (ignored) until stdout closes; enforce the flood cap."""
    while True:
        chunk = await stdout.read(READ_CHUNK)
        if not chunk:
            return None
        flood = budget.spend(len(chunk))
        if flood is not None:
            return flood
