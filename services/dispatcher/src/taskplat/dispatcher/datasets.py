"""Datasets: reading datasets, their versions and their events (a dataset's or a task's), and
changing a dataset's current version (a new version, or a rollback). Each public call is one
transaction.

Invariants:
  * datasets are created by applying DAG documents (`dags`) and never deleted; here they are
    read and their current version changed;
  * a change of a dataset's current version (a new version, or a rollback to an earlier one)
    cancels the live tasks pinned to other versions in the transaction that makes it current,
    under the dataset row's lock (routing and new tasks' pins share-lock it); making the current
    version current again changes nothing;
  * a buffered_postgres dataset's new version gets its table (the current table's schema) in the
    transaction that makes the version, so its current version always has one;
  * an event list is newest first, paged by an opaque cursor (the last event id); a cursor this
    API did not answer is a 422 naming `query.cursor`.
"""

from __future__ import annotations

import base64
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from taskplat.common.buffered import Column
from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    DatasetList,
    DatasetSummary,
    DatasetVersionView,
    DatasetView,
    EventList,
    EventView,
    NewVersionResponse,
)
from taskplat.common.contracts.dags import Producer
from taskplat.common.errors import NotFound, ValidationFailed
from taskplat.dispatcher import audit
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import buffered as buffered_repo
from taskplat.dispatcher.repository import dags as repo
from taskplat.dispatcher.repository import tasks as task_repo

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


def encode_event_cursor(event_id: int) -> str:
    return base64.urlsafe_b64encode(f"e{event_id}".encode()).decode().rstrip("=")


def decode_event_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not text.startswith("e"):
            raise ValueError(cursor)
        return int(text[1:])
    except ValueError:
        raise ValidationFailed(
            "cursor is not a cursor this API returned",
            detail=[{"loc": ["query", "cursor"], "msg": "invalid cursor", "type": "cursor"}],
        ) from None


class DatasetService:
    def __init__(self, pool: AsyncConnectionPool[Conn], clock: Clock, recorder: Recorder) -> None:
        self._pool = pool
        self._clock = clock
        self._recorder = recorder

    async def list_datasets(self) -> DatasetList:
        async with self._pool.connection() as conn:
            rows = await repo.list_datasets(conn)
        return DatasetList(datasets=[DatasetSummary.model_validate(row) for row in rows])

    async def get_dataset(self, dataset_uuid: UUID) -> DatasetView:
        async with self._pool.connection() as conn:
            view = await self._dataset_view(conn, dataset_uuid)
        return view

    async def _dataset_view(self, conn: Conn, dataset_uuid: UUID) -> DatasetView:
        found = await repo.get_dataset(conn, dataset_uuid)
        if found is None:
            raise NotFound(f"dataset {dataset_uuid} not found")
        row, versions = found
        buffered = (
            await buffered_repo.buffered_view(conn, dataset_uuid)
            if row["kind"] == "buffered_postgres"
            else None
        )
        return DatasetView.model_validate(
            {
                **{key: row[key] for key in DatasetView.model_fields if key in row},
                "versions": [DatasetVersionView.model_validate(v) for v in versions],
                **(buffered or {}),
            }
        )

    async def new_version(self, dataset_uuid: UUID, call: AuditCall) -> NewVersionResponse:
        now = self._clock.sql_now()
        async with self._pool.connection() as conn:
            async with conn.transaction():
                if await repo.lock_dataset(conn, dataset_uuid) is None:
                    raise NotFound(f"dataset {dataset_uuid} not found")
                current = await buffered_repo.current_table(conn, dataset_uuid)
                version = uuid4()
                canceled = await repo.make_version_current(
                    conn, dataset_uuid, version, "created", now
                )
                if current is not None:
                    # A buffered dataset's new version gets a new table of the same schema.
                    columns = [Column(c["name"], c["type"]) for c in current["columns"]]
                    await buffered_repo.create_table(conn, dataset_uuid, version, columns, now)
                await audit.record(
                    conn,
                    call,
                    f"version {version}, {len(canceled)} tasks canceled",
                    detail={"dataset_version": str(version), "canceled_tasks": len(canceled)},
                    now=now,
                )
            view = await self._dataset_view(conn, dataset_uuid)
        for row in canceled:
            self._recorder.task_canceled(row, by="version_rollover")
        return NewVersionResponse(dataset=view, canceled_tasks=len(canceled))

    async def make_current(
        self, dataset_uuid: UUID, dataset_version: UUID, call: AuditCall
    ) -> NewVersionResponse:
        """Make an earlier version current again (a rollback): the live tasks pinned to the
        version that stops being current are canceled in the same transaction. The current
        version again changes nothing."""
        now = self._clock.sql_now()
        canceled: list[Row] = []
        async with self._pool.connection() as conn:
            async with conn.transaction():
                locked = await repo.lock_dataset(conn, dataset_uuid)
                if locked is None:
                    raise NotFound(f"dataset {dataset_uuid} not found")
                if not await repo.version_exists(conn, dataset_uuid, dataset_version):
                    raise ValidationFailed(
                        f"{dataset_version} is not a version of dataset {dataset_uuid}",
                        detail=[{"loc": ["body", "dataset_version"], "msg": "unknown version",
                                 "type": "unknown_version"}],
                    )  # fmt: skip
                if locked["current_version"] != dataset_version:
                    canceled = await repo.make_version_current(
                        conn, dataset_uuid, dataset_version, "rollback", now
                    )
                    outcome = f"rolled back to {dataset_version}, {len(canceled)} tasks canceled"
                else:
                    outcome = f"{dataset_version} already current"
                await audit.record(
                    conn,
                    call,
                    outcome,
                    detail={
                        "dataset_version": str(dataset_version),
                        "canceled_tasks": len(canceled),
                    },
                    now=now,
                )
            view = await self._dataset_view(conn, dataset_uuid)
        for row in canceled:
            self._recorder.task_canceled(row, by="version_rollback")
        return NewVersionResponse(dataset=view, canceled_tasks=len(canceled))

    async def events(
        self, dataset_uuid: UUID, dataset_version: UUID | None, cursor: str | None, limit: int
    ) -> EventList:
        params = {
            "dataset_uuid": dataset_uuid,
            "dataset_version": dataset_version,
            "before_event_id": decode_event_cursor(cursor) if cursor else None,
            "limit": limit + 1,
        }
        async with self._pool.connection() as conn:
            if await repo.get_dataset(conn, dataset_uuid) is None:
                raise NotFound(f"dataset {dataset_uuid} not found")
            rows = await repo.list_events(conn, params)
        return _page(rows, limit)

    async def task_events(self, task_id: UUID, cursor: str | None, limit: int) -> EventList:
        """The events a task emitted, newest first (404 for an unknown task)."""
        params = {
            "task_id": task_id,
            "before_event_id": decode_event_cursor(cursor) if cursor else None,
            "limit": limit + 1,
        }
        async with self._pool.connection() as conn:
            if await task_repo.get_task(conn, task_id) is None:
                raise NotFound(f"task {task_id} not found")
            rows = await repo.task_events(conn, params)
        return _page(rows, limit)


def _page(rows: list[Row], limit: int) -> EventList:
    page = rows[:limit]
    next_cursor = encode_event_cursor(page[-1]["event_id"]) if len(rows) > limit else None
    return EventList(events=[_event_view(row) for row in page], next_cursor=next_cursor)


def _event_view(row: Row) -> EventView:
    routed = row["routed_at"] is not None and row["route_reason"] is None
    reason = row["route_reason"] if row["routed_at"] is not None else "Pending"
    return EventView(
        event_id=row["event_id"],
        dataset_uuid=row["dataset_uuid"],
        dataset_version=row["dataset_version"],
        cursor=row["cursor"],
        partition_key=row["partition_key"],
        start=row["range_start"],
        end=row["range_end"],
        producer=Producer(task_id=row["task_id"], attempt=row["attempt"]),
        routed=routed,
        reason=reason,
        tasks=list(row["tasks"]),
        created_at=row["created_at"],
        routed_at=row["routed_at"],
    )
