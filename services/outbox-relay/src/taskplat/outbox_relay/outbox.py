"""Outbox rows as the relay sees them: claim a batch, mark rows sent, push failed rows back.

Invariants: functions take the caller's connection and never commit; the caller holds one
transaction from `claim_pending` to the marks, so the claimed rows stay locked (and invisible to
other relays, through SKIP LOCKED) exactly as long as the batch. Every update is guarded by
`sent_at IS NULL`, so a row is marked sent at most once. With `skip_not_queued`, `claim_pending`
itself marks sent (with `skipped = true`) the `enqueue_task` rows whose task is not Queued in its
snapshot and returns them flagged `skipped`: nothing is to be sent for them. Every transition into
Queued writes its own `enqueue_task` row, so a task Queued when its row is claimed is always sent,
or held: with a `Hold` depth, the wake-up of a task deep in a backlog that its queue's workers drain
by claiming ahead stays pending (flagged `held`, due again within `Hold.max_seconds`) instead of
being sent; each time it comes due it is skipped, held again or sent: delayed, never lost.
Likewise a wake-up of a queue held because its SQS queue does not exist (`missing_queues`) comes
back flagged `deferred`, pushed to that queue's next probe, never sent to the missing queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from psycopg import Connection
from psycopg.rows import DictRow

from taskplat.common.db.queries import load_queries
from taskplat.outbox_relay.settings import HOLD_EVIDENCE_SECONDS

Q = load_queries("taskplat.outbox_relay", "outbox.sql")

Conn = Connection[DictRow]
OutboxKind = Literal["enqueue_task", "dead_letter", "route_event", "invoke_lambda"]


@dataclass(frozen=True, slots=True)
class OutboxRow:
    outbox_id: int
    kind: OutboxKind
    task_id: UUID
    queue: str
    payload: dict[str, Any]
    trace_context: dict[str, Any] | None
    send_attempts: int
    # Marked sent without a message: its task was not Queued when the row was claimed.
    skipped: bool = False
    # Held back, still pending: its task is deep in a backlog its workers claim ahead.
    held: bool = False
    # Deferred to its queue's next probe, still pending: its SQS queue does not exist.
    deferred: bool = False


@dataclass(frozen=True, slots=True)
class Failure:
    """A row whose send failed: why, and how long to wait before the next try."""

    outbox_id: int
    error: str
    delay_seconds: float


@dataclass(frozen=True, slots=True)
class Hold:
    """When wake-ups are held back (`claim_pending`): `depth` Queued tasks ahead (0: never), the
    queue claimed ahead within `evidence_seconds`; due again within `max_seconds`."""

    depth: int = 0
    max_seconds: float = 10.0
    evidence_seconds: float = HOLD_EVIDENCE_SECONDS


def claim_pending(
    conn: Conn,
    *,
    limit: int,
    now: datetime | None,
    skip_not_queued: bool = False,
    hold: Hold | None = None,
) -> list[OutboxRow]:
    """Lock and return up to `limit` due, unsent rows, oldest due first (`available_at`, then
    `outbox_id`); with `skip_not_queued`, wake-ups of tasks no longer Queued come back already
    marked sent and flagged `skipped`, and (with a `hold` depth) wake-ups deep in a backlog that
    is claimed ahead come back still pending, due later, and flagged `held`; wake-ups of a queue
    held for its missing SQS queue come back pending, due at its next probe, flagged `deferred`."""
    hold = hold or Hold()
    params = {
        "limit": limit,
        "now": now,
        "skip_not_queued": skip_not_queued,
        "hold_depth": hold.depth,
        "hold_max_seconds": hold.max_seconds,
        "hold_evidence_seconds": hold.evidence_seconds,
    }
    rows = conn.execute(Q["claim_pending"], params).fetchall()
    return [
        OutboxRow(
            outbox_id=row["outbox_id"],
            kind=row["kind"],
            task_id=row["task_id"],
            queue=row["queue"],
            payload=row["payload"],
            trace_context=row["trace_context"],
            send_attempts=row["send_attempts"],
            skipped=row["skipped"],
            held=row["held"],
            deferred=row["deferred"],
        )
        for row in rows
    ]


def mark_sent(conn: Conn, ids: Sequence[int], *, now: datetime | None) -> list[int]:
    """Set `sent_at` on the given unsent rows; returns the ids it marked."""
    if not ids:
        return []
    rows = conn.execute(Q["mark_sent"], {"ids": list(ids), "now": now}).fetchall()
    return [row["outbox_id"] for row in rows]


def mark_failed(conn: Conn, failures: Sequence[Failure], *, now: datetime | None) -> int:
    """Count a failed send, record its error and make the row due again after its delay."""
    if not failures:
        return 0
    params = {
        "ids": [failure.outbox_id for failure in failures],
        "errors": [failure.error for failure in failures],
        "delays": [failure.delay_seconds for failure in failures],
        "now": now,
    }
    return len(conn.execute(Q["mark_failed"], params).fetchall())
