"""Routing of dataset events to the jobs that read the dataset: the work behind a `route_event`
outbox row (queries in `dataset_events.sql`).

Invariants:
  * functions take the relay's connection and never commit: the tasks an event creates, their
    wake-ups (`enqueue_task` rows), the route keys and the event's routed mark commit in the
    relay's batch transaction, together with the `route_event` rows marked sent. A relay killed
    before that commit leaves none of it, and the rows are routed again by whichever replica
    claims them next;
  * each event is routed once (`routed_at IS NULL`, row locked) and creates at most one task per
    (job, dataset, version, position) ever (the `event_routes` key), so duplicate events, repeated
    rows and racing replicas create nothing twice;
  * only events of their dataset's current version are routed (the dataset rows are share-locked
    first, so a change of the current version, new or rollback, cannot interleave); the others are
    marked with their reason;
  * a position of a dataset version (cursor, partition or range) is routed once, for the first
    event routed there (`event_positions`); a later event at that position, from any producer,
    is marked `Duplicate` and creates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.outbox_relay.routing", "dataset_events.sql")

Conn = Connection[DictRow]


@dataclass(frozen=True, slots=True)
class RoutedEvent:
    """What routing did with one event."""

    event_id: int
    reason: str | None  # None: routed (maybe to no job); else why it created nothing
    event_created_at: datetime
    tasks: list[UUID] = field(default_factory=list)


def route_events(
    conn: Conn, event_ids: Sequence[int], *, now: datetime | None, hold_seconds: float = 0.0
) -> list[RoutedEvent]:
    """Route the unrouted events among `event_ids` inside the caller's transaction; events already
    routed (by an earlier, committed batch) are left alone and not returned. `hold_seconds`: how
    long a run's wake-up is held while its queue's workers wait on a dispatcher."""
    if not event_ids:
        return []
    params: dict[str, Any] = {"event_ids": list(event_ids), "now": now}
    conn.execute(Q["lock_event_datasets"], params)
    rows = conn.execute(Q["route_events"], params).fetchall()
    events: dict[int, RoutedEvent] = {}
    runs: list[DictRow] = []
    for row in rows:
        event = events.setdefault(
            row["event_id"], RoutedEvent(row["event_id"], row["reason"], row["event_created_at"])
        )
        if row["task_id"] is not None:
            runs.append(row)
            event.tasks.append(row["task_id"])
    if runs:
        started = conn.execute(
            Q["start_routed_runs"],
            {
                "dag_names": [run["dag_name"] for run in runs],
                "job_names": [run["job_name"] for run in runs],
                "inputs": [Jsonb(run["input"]) for run in runs],
                "task_ids": [run["task_id"] for run in runs],
                "now": now,
                "hold_seconds": hold_seconds,
            },
        ).fetchall()
        missing = {row["task_id"] for row in started if row["started"] is None}
        if missing:
            for event in events.values():
                event.tasks[:] = [task for task in event.tasks if task not in missing]
    return list(events.values())
