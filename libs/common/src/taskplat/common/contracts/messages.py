"""SQS message bodies.

Invariants: a wake-up body is exactly `{"task_id": "<uuid>"}`; trace context travels in message
attributes, never in the body. A dead-letter record describes a task that became Dead
(`record: dead`); when a late success of the attempt that timed out later completes that task, a
second record (`record: resolved`, same task and attempt, with `resolved_at`) follows it, so a
consumer of the first learns that the task completed after all.
"""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import AwareDatetime, Field

from taskplat.common.contracts.base import Contract


class WakeUpMessage(Contract):
    task_id: UUID


class DeadLetterRecord(Contract):
    record: Literal["dead", "resolved"] = Field(
        "dead",
        description="`dead`: the task became Dead. `resolved`: a task already dead-lettered "
        "completed after all (a late success of the attempt that timed out).",
    )
    task_id: UUID
    queue: str
    operator: str
    attempt: int
    max_attempts: int
    dead_reason: str
    last_error: str | None
    died_at: AwareDatetime
    resolved_at: AwareDatetime | None = Field(
        None, description="With `record: resolved`: when the late success was accepted."
    )
