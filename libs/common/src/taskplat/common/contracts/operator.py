"""Contracts of the operator protocol (docs/contracts.md, "Operator protocol"): the task line an
operator runtime reads and the result envelope it answers with.

Invariants: a task line is the claim's task with the attempt's `lease_token` (a Lambda
invocation's claim gives its runtime the same document); a pooled operator's line may carry the
W3C trace context (`traceparent`, `tracestate`). An envelope is `succeeded` with a payload object
(or null), or `failed` with an error (`retryable: false` fails the task for good); its free JSON
holds no NaN or Infinity (JSON has neither). The operator runtimes in TypeScript and Rust
generate their `Task` and `Envelope` types from these schemas (their snapshots under
libs/common/tests/snapshots), so a change here shows in their generated files too.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field

from taskplat.common.contracts.base import Contract, JsonObject
from taskplat.common.contracts.internal import ClaimTask, Event, Output

EnvelopeStatus = Literal["succeeded", "failed"]


class TaskLine(ClaimTask):
    """The task an operator runs: one JSON line on its stdin (worker wrapper), or a Lambda
    claim's `task` with the claim's `lease_token`."""

    lease_token: UUID = Field(description="The attempt's lease: with `attempt`, its fence.")
    traceparent: str | None = Field(
        None, description="A pooled operator's W3C trace context to continue, if traced."
    )
    tracestate: str | None = Field(None, description="The W3C trace state, with `traceparent`.")


class ResultEnvelope(Contract):
    """The last line of an operator's answer to one task (and what its Lambda runtime reports)."""

    status: EnvelopeStatus
    payload: JsonObject | None = Field(
        None, description="`succeeded`: the result, an object or null."
    )
    outputs: Annotated[list[Output], Field(max_length=1000)] | None = Field(
        None, description="`succeeded`: what the task materialized, one entry per output."
    )
    events: Annotated[list[Event], Field(max_length=1000)] | None = Field(
        None, description="`succeeded`: final events, sent with the completion."
    )
    error: str | None = Field(None, description="`failed`: why.")
    retryable: Literal[False] | None = Field(
        None, description="`failed`: false fails the task for good (no retry, Dead at once)."
    )
