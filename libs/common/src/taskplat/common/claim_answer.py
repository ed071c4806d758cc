"""The answer to a claim, built from the row the claim functions return (taskplat_claim and
taskplat_claim_next, migration 0020): the dispatcher answers its claims with it and the relay
sends it to a Lambda function, so both build it here.

Invariants:
  * the answer is built from the claimed row alone (committed values);
  * its attempt token, and an untrusted attempt's capability token, are issued at the claim's
    `started_at` and expire `extra` after the later of the attempt's deadline and its lease's end
    (a late reply of the attempt may still land).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from taskplat.common.contracts import ClaimedResponse, ClaimTask
from taskplat.common.tokens.attempt import issue_attempt_token
from taskplat.common.tokens.capability import (
    StorageLayout,
    build_capability,
    issue_capability_token,
)
from taskplat.common.tokens.keys import KeyRing

Row = Mapping[str, Any]
_CLAIM_TASK_FIELDS = tuple(ClaimTask.model_fields)


def claim_task(row: Row, *, trust: str | None = None) -> ClaimTask:
    """The claimed task as a claim answers it (`trust` overrides the row's)."""
    fields = {field: row[field] for field in _CLAIM_TASK_FIELDS if field in row}
    if trust is not None:
        fields["trust"] = trust
    return ClaimTask.model_validate(fields)


def token_expiry(row: Row, extra: timedelta) -> datetime:
    """When the tokens of the claimed attempt expire."""
    lease_end: datetime = row["lease_expires_at"]
    deadline: datetime | None = row["deadline_at"]
    return max(deadline or lease_end, lease_end) + extra


def attempt_token(ring: KeyRing, row: Row, extra: timedelta) -> str:
    """The attempt token of the claimed attempt."""
    return issue_attempt_token(
        ring, row["task_id"], row["attempt"], now=row["started_at"],
        expires_at=token_expiry(row, extra),
    )  # fmt: skip


def capability_token(ring: KeyRing, row: Row, layout: StorageLayout, extra: timedelta) -> str:
    """The capability token of the claimed (untrusted) attempt: its pinned inputs and its
    output and scratch prefixes."""
    capability = build_capability(
        row["task_id"],
        row["attempt"],
        row.get("inputs") or [],
        row.get("outputs") or [],
        layout=layout,
    )
    return issue_capability_token(
        ring, capability, now=row["started_at"], expires_at=token_expiry(row, extra)
    )


def claimed_response(
    row: Row,
    *,
    attempt_token: str,
    capability_token: str | None = None,
    trust: str | None = None,
) -> ClaimedResponse:
    """The Claimed answer of the claimed row."""
    return ClaimedResponse(
        attempt=row["attempt"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        task=claim_task(row, trust=trust),
        attempt_token=attempt_token,
        capability_token=capability_token,
        trace_context=row.get("trace_context"),
    )
