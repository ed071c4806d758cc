"""Task rows: inserts, reads and the guarded transitions of `tasks.sql`.

Invariants: each transition is one guarded statement returning the changed row or None; None means
the guard did not match and nothing was written. Functions take the caller's connection and never
commit, except `insert_task_and_claim_next`, which owns its transaction (a savepoint when the
caller has one).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from taskplat.common.contracts import CompleteRequest, Event
from taskplat.common.db.queries import load_queries
from taskplat.common.db.round_trip import (
    Statement,
    rows_of,
    send,
    transaction_in_one_round_trip,
)

Q = load_queries("taskplat.dispatcher.repository", "tasks.sql")
batch_queries = load_queries("taskplat.dispatcher.repository", "batch.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


async def _one(conn: Conn, name: str, params: dict[str, Any]) -> Row | None:
    cursor = await conn.execute(Q[name], params)
    return await cursor.fetchone()


def wakeup_trace_context(trace_context: dict[str, str] | None) -> Jsonb | None:
    """An outbox row's `trace_context` parameter: the carrier, or NULL when there is none."""
    return Jsonb(trace_context) if trace_context else None


# Field of taskplat_new_task -> array parameter of `insert_tasks`.
NEW_TASK_ARRAYS = {
    "task_id": "task_ids",
    "queue": "queues",
    "operator": "operators",
    "job": "jobs",
    "config": "configs",
    "inputs": "inputs",
    "max_attempts": "max_attempts",
    "max_processing_attempts": "max_processing_attempts",
    "on_exhausted": "on_exhausteds",
    "backoff_base_seconds": "backoff_base_seconds",
    "backoff_max_seconds": "backoff_max_seconds",
    "timeout_seconds": "timeout_seconds",
    "scheduled_for": "scheduled_for",
    "expires_at": "expires_at",
    "idempotency_key": "idempotency_keys",
    "priority": "priorities",
    "concurrency_key": "concurrency_keys",
}


def new_task_params(values: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The array parameters of `insert_tasks` for new tasks' values (one dict per task, keyed by
    the fields of taskplat_new_task), in order."""
    return {array: [each[field] for each in values] for field, array in NEW_TASK_ARRAYS.items()}


async def insert_tasks(conn: Conn, params: dict[str, Any]) -> list[Row]:
    """Create tasks (`new_task_params`, plus `now`, `trace_context` as `wakeup_trace_context`
    gives it, `polled_wakeup_delay_seconds` and `notify_held`) in one statement: each Queued one
    with its wake-up and NOTIFY. The inserted tasks' rows, in order (an element whose
    idempotency key already exists is skipped); on an autocommit connection committed on return.
    `notify_held` false: a held wake-up NOTIFYs no one (the row's `held` says it was held)."""
    cursor = await conn.execute(Q["insert_tasks"], params)
    return await cursor.fetchall()


async def insert_task(conn: Conn, params: dict[str, Any]) -> Row | None:
    """`insert_tasks` of one task: its row, or None when its idempotency key already exists."""
    return await _one(conn, "insert_tasks", params)


async def insert_task_and(
    conn: Conn, params: dict[str, Any], statements: Sequence[Statement]
) -> tuple[Row | None, list[list[Row]]]:
    """`insert_task`, then `statements` (a claim-next, which sees the new task), in a transaction
    of their own, committed on return (a savepoint inside the caller's transaction): the new
    task's row (None: its idempotency key exists) and the rows of each statement. On an
    autocommit connection outside a transaction, BEGIN, the statements and the COMMIT go to
    Postgres together (`transaction_in_one_round_trip`): one round trip. An error in any
    statement rolls them all back."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        async with conn.pipeline():
            async with conn.transaction():  # a savepoint in the caller's transaction
                inserting = await conn.execute(Q["insert_tasks"], params)
                cursors = await send(conn, statements)
            return await inserting.fetchone(), await rows_of(cursors)
    inserted, *rows = await transaction_in_one_round_trip(
        conn, [(Q["insert_tasks"], params), *statements]
    )
    return (inserted[0] if inserted else None), rows


async def notify_outbox(conn: Conn, queue: str) -> None:
    """Wake the relay for `queue` (delivered on commit)."""
    await conn.execute(Q["notify_outbox"], {"queue": queue})


async def enqueue_dead_letter(
    conn: Conn,
    *,
    task_id: UUID,
    queue: str,
    now: datetime | None,
    trace_context: dict[str, str] | None = None,
) -> None:
    """Write the `dead_letter` outbox row of a task that is Dead (and notify the relay)."""
    await conn.execute(
        Q["insert_outbox_dead_letter"],
        {
            "task_id": task_id,
            "now": now,
            "trace_context": wakeup_trace_context(trace_context),
        },
    )
    await conn.execute(Q["notify_outbox"], {"queue": queue})


async def get_task(conn: Conn, task_id: UUID) -> Row | None:
    return await _one(conn, "get_task", {"task_id": task_id})


async def get_task_by_idempotency_key(conn: Conn, key: str) -> Row | None:
    """The task holding idempotency key `key`, as `get_task` reads it (None: no task holds it),
    in one statement."""
    return await _one(conn, "get_task_by_idempotency_key", {"idempotency_key": key})


async def list_tasks(conn: Conn, params: dict[str, Any]) -> list[Row]:
    cursor = await conn.execute(Q["list_tasks"], params)
    return await cursor.fetchall()


async def read_fence(conn: Conn, task_id: UUID, *, for_update: bool = False) -> Row | None:
    """The task's status, attempt and lease (plus the attempt's completion digest, locked)."""
    name = "read_fence_for_update" if for_update else "read_fence"
    return await _one(conn, name, {"task_id": task_id})


async def claim_task(conn: Conn, params: dict[str, Any]) -> Row | None:
    return await _one(conn, "claim_task", params)


async def fetch_task(conn: Conn, task_id: UUID) -> Row | None:
    return await _one(conn, "fetch_task", {"task_id": task_id})


async def heartbeat(conn: Conn, params: dict[str, Any]) -> Row | None:
    return await _one(conn, "heartbeat", params)


def _event_arrays(events: Sequence[Event]) -> dict[str, list[Any]]:
    return {
        "dataset_uuids": [event.dataset_uuid for event in events],
        "dataset_versions": [event.dataset_version for event in events],
        "cursors": [event.cursor for event in events],
        "partition_keys": [event.partition_key for event in events],
        "range_starts": [event.start for event in events],
        "range_ends": [event.end for event in events],
    }


async def insert_events_guarded(
    conn: Conn,
    *,
    task_id: UUID,
    attempt: int,
    lease_token: UUID | None,
    events: Sequence[Event],
    now: datetime | None,
) -> tuple[bool, int]:
    """Store events if the attempt is Running (and holds the lease); (guard matched, stored)."""
    row = await _one(
        conn,
        "insert_events",
        {
            "task_id": task_id,
            "attempt": attempt,
            "lease_token": lease_token,
            "now": now,
            **_event_arrays(events),
        },
    )
    assert row is not None
    return bool(row["guarded"]), int(row["inserted"])


def completion_params(
    request: CompleteRequest,
    *,
    digest: str,
    jitter: float,
    now: datetime | None,
    trace_context: dict[str, str] | None,
) -> dict[str, Any]:
    """The parameters of `complete_running` (and of `complete_late`, which uses a subset)."""
    return {
        "task_id": request.task_id,
        "attempt": request.attempt,
        "lease_token": request.lease_token,
        "status": request.status,
        "ended": request.ended,
        "retryable": request.retryable,
        "result": Jsonb(request.result) if request.result is not None else None,
        "error_message": request.error_message,
        "retry_after_seconds": request.retry_after_seconds,
        "jitter": jitter,
        "completion_digest": digest,
        "trace_context": Jsonb(trace_context) if trace_context else None,
        "now": now,
        "events": Jsonb([event.model_dump(mode="json") for event in request.events]),
        "outputs": Jsonb([output.model_dump(mode="json") for output in request.outputs]),
    }


async def complete_running(conn: Conn, params: dict[str, Any]) -> Row | None:
    """The current holder's completion with everything it carries, in one statement (committed
    on return in autocommit mode); None when the guard did not match and nothing was written.

    The statement writes the transition (Failed becomes Dead once the attempt budget is used up,
    else a retry is scheduled with capped, fully jittered backoff), closes the attempt record
    with the completion digest, stores the events and (Completed only) the outputs, replacing
    those of an earlier completion of a replayed task, and for a task that became Dead its
    dead-letter outbox row and the relay's notification; all of it only if the guard matched.
    (The SQL stays under psycopg's 4 KiB query cache limit: a longer query is parsed anew on
    every execution.)"""
    return await _one(conn, "complete_running", params)


async def complete_late(conn: Conn, params: dict[str, Any]) -> Row | None:
    """A late success of the current attempt after its timeout (`completion_params`), with its
    attempt record, events and outputs, in one statement; None when it is not accepted. The
    caller holds the row lock."""
    return await _one(conn, "complete_late", params)


async def cancel_task(conn: Conn, task_id: UUID, now: datetime | None) -> Row | None:
    """Cancel a task that has not finished; the canceled row (queue, operator...) or None."""
    return await _one(conn, "cancel_task", {"task_id": task_id, "now": now})


async def replay_pins(conn: Conn, task_ids: Sequence[UUID], *, repin: bool) -> list[UUID]:
    """Lock the Dead or Canceled tasks among `task_ids` and the datasets they are pinned to; the
    ones pinned to a version that is no longer current (none with `repin`: re-pinned)."""
    cursor = await conn.execute(Q["replay_pins"], {"task_ids": list(task_ids), "repin": repin})
    return [row["task_id"] for row in await cursor.fetchall()]


async def replay_task(
    conn: Conn, task_id: UUID, now: datetime | None, trace_context: dict[str, str] | None
) -> Row | None:
    """Replay a Dead or Canceled task with its wake-up; None when it is neither."""
    params = {"task_id": task_id, "now": now, "trace_context": wakeup_trace_context(trace_context)}
    return await _one(conn, "replay_task", params)


async def ping(conn: Conn) -> None:
    await conn.execute(Q["ping"])


async def record_step(conn: Conn, params: dict[str, Any]) -> Row:
    """{guarded, inserted, recorded_attempt, result} of a step lookup or record (`record_step`)."""
    row = await _one(conn, "record_step", {**params, "result": Jsonb(params["result"])})
    assert row is not None
    return row
