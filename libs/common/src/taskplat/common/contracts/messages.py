"""SQS message bodies.

Invariants: a wake-up body is exactly `{"task_id": "<uuid>"}`; trace context travels in message
attributes, never in the body. A dead-letter record describes a task that became Dead.
"""

from __future__ import annotations

from uuid import UUID

from pydantic import AwareDatetime

from taskplat.common.contracts.base import Contract


class WakeUpMessage(Contract):
    task_id: UUID


class DeadLetterRecord(Contract):
    task_id: UUID
    queue: str
    operator: str
    attempt: int
    max_attempts: int
    dead_reason: str
    last_error: str | None
    died_at: AwareDatetime
