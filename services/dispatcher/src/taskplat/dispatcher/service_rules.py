"""Pure rules of the task service: list cursors, completion digests, and why a worker call was
stale.

Invariants: no I/O; a cursor is an opaque, URL-safe encoding of (created_at, task_id) and a
malformed one is a 422; a rejection's reason is classified in a fixed order (NotFound,
StaleAttempt, StaleLease, Canceled, NotRunning) from a fresh read of the task.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from taskplat.common.contracts import CompleteRequest, NotClaimedReason
from taskplat.common.errors import Rejected, ValidationFailed

NOT_CLAIMED_REASONS: dict[str, NotClaimedReason] = {
    "Running": "AlreadyRunning",
    "Completed": "Completed",
    "Canceled": "Canceled",
}


@dataclass(frozen=True)
class ListFilters:
    status: str | None
    queue: str | None
    operator: str | None
    cursor: str | None
    limit: int
    dag: str | None = None
    job: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    idempotency_key: str | None = None


def completion_digest(request: CompleteRequest) -> str:
    """A stable digest of a completion, to recognise an exact repeat (the failure fields count
    only when set, so a digest stored before they existed still matches its repeat)."""
    data = request.model_dump(mode="json")
    if data["reason"] is None:
        del data["reason"]
    if data["retryable"]:
        del data["retryable"]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode_cursor(created_at: datetime, task_id: UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(task_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at_text, task_id_text = json.loads(raw)
        created_at = datetime.fromisoformat(created_at_text)
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        return created_at, UUID(task_id_text)
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError) as exc:
        raise ValidationFailed(
            "invalid cursor", detail=[{"loc": ["query", "cursor"], "msg": "not a cursor"}]
        ) from exc


def classify_rejection(
    fence: dict[str, Any] | None, attempt: int, lease_token: UUID | None
) -> Rejected:
    """Why a guarded worker call did not match, from a fresh read of the task."""
    if fence is None:
        return Rejected("NotFound", "task not found")
    if fence["attempt"] != attempt:
        return Rejected("StaleAttempt", f"attempt {attempt} is not current ({fence['attempt']})")
    if lease_token is not None and fence["lease_token"] != lease_token:
        return Rejected("StaleLease", "lease token does not match the current lease")
    if fence["status"] == "Canceled":
        return Rejected("Canceled", "task was canceled")
    return Rejected("NotRunning", f"task is {fence['status']}, not Running")
