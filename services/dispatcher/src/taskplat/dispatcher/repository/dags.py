"""DAG, job and dataset rows (`dags.sql`).

Invariants: functions take the caller's connection and never commit; `apply` callers hold
`lock_dag` for the whole replacement, and a caller changing a dataset's current version holds
`lock_dataset`. A dataset is found or created by name, so two DAGs naming the same dataset share
it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from taskplat.common.db.queries import load_queries

Q = load_queries("taskplat.dispatcher.repository", "dags.sql")

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


async def _one(conn: Conn, name: str, params: dict[str, Any]) -> Row | None:
    cursor = await conn.execute(Q[name], params)
    return await cursor.fetchone()


async def _all(conn: Conn, name: str, params: dict[str, Any]) -> list[Row]:
    cursor = await conn.execute(Q[name], params)
    return await cursor.fetchall()


async def lock_dag(conn: Conn, dag_name: str) -> str | None:
    """Take the DAG's transaction lock; the hash of its stored document (None when new)."""
    await conn.execute(Q["lock_dag"], {"dag_name": dag_name})
    row = await _one(conn, "dag_hash", {"dag_name": dag_name})
    return None if row is None else str(row["document_hash"])


async def store_dag(
    conn: Conn, dag_name: str, document: dict[str, Any], document_hash: str, now: datetime | None
) -> None:
    """Store the DAG's document and drop its jobs (with their edges and outputs)."""
    params = {
        "dag_name": dag_name,
        "document": Jsonb(document),
        "document_hash": document_hash,
        "now": now,
    }
    await conn.execute(Q["upsert_dag"], params)
    await conn.execute(Q["delete_jobs"], {"dag_name": dag_name})


async def ensure_dataset(
    conn: Conn, *, name: str, kind: str, location: str, now: datetime | None
) -> Row:
    """The dataset named `name` ({dataset_uuid, name, kind}), created with its first version when
    missing."""
    params = {"name": name, "kind": kind, "location": location, "now": now}
    await conn.execute(Q["create_dataset"], params)
    row = await _one(conn, "find_dataset", {"name": name})
    assert row is not None  # created, or created by a committed concurrent apply
    return row


async def find_dataset(conn: Conn, name: str) -> Row | None:
    return await _one(conn, "find_dataset", {"name": name})


async def insert_job(conn: Conn, params: dict[str, Any]) -> None:
    await conn.execute(Q["insert_job"], {**params, "config": Jsonb(params["config"])})


async def insert_job_outputs(
    conn: Conn, dag_name: str, job_name: str, outputs: list[tuple[int, UUID]]
) -> None:
    if outputs:
        await conn.execute(
            Q["insert_job_outputs"],
            {
                "dag_name": dag_name,
                "job_name": job_name,
                "output_indexes": [index for index, _ in outputs],
                "dataset_uuids": [dataset for _, dataset in outputs],
            },
        )


async def insert_job_inputs(
    conn: Conn,
    dag_name: str,
    job_name: str,
    inputs: list[tuple[UUID, str | None, int | None, str | None]],
) -> None:
    """Edges in document order: (dataset_uuid, from_job, from_output_index, where)."""
    if inputs:
        await conn.execute(
            Q["insert_job_inputs"],
            {
                "dag_name": dag_name,
                "job_name": job_name,
                "positions": list(range(len(inputs))),
                "dataset_uuids": [edge[0] for edge in inputs],
                "from_jobs": [edge[1] for edge in inputs],
                "from_output_indexes": [edge[2] for edge in inputs],
                "where_clauses": [edge[3] for edge in inputs],
            },
        )


async def get_dag(conn: Conn, dag_name: str) -> Row | None:
    return await _one(conn, "get_dag", {"dag_name": dag_name})


async def dag_parts(conn: Conn, dag_name: str) -> tuple[list[Row], list[Row], list[Row]]:
    """The DAG's jobs, input edges and outputs (with dataset names)."""
    params = {"dag_name": dag_name}
    return (
        await _all(conn, "dag_jobs", params),
        await _all(conn, "dag_job_inputs", params),
        await _all(conn, "dag_job_outputs", params),
    )


async def list_dags(conn: Conn) -> list[Row]:
    return await _all(conn, "list_dags", {})


async def delete_dag(conn: Conn, dag_name: str) -> bool:
    return await _one(conn, "delete_dag", {"dag_name": dag_name}) is not None


async def job_exists(conn: Conn, dag_name: str, job_name: str) -> bool:
    return await _one(conn, "job_exists", {"dag_name": dag_name, "job_name": job_name}) is not None


async def start_job_run(conn: Conn, params: dict[str, Any]) -> UUID | None:
    """Start a run (task, pins, wake-up and its NOTIFY); None when the idempotency key names a
    task already."""
    row = await _one(
        conn,
        "start_job_run",
        {
            **params,
            "inputs": Jsonb(params["inputs"]),
            "config": Jsonb(params["config"]),
            "trace_context": Jsonb(params["trace_context"]) if params["trace_context"] else None,
        },
    )
    assert row is not None
    task_id: UUID | None = row["task_id"]
    return task_id


async def list_datasets(conn: Conn) -> list[Row]:
    return await _all(conn, "list_datasets", {})


async def get_dataset(conn: Conn, dataset_uuid: UUID) -> tuple[Row, list[Row]] | None:
    row = await _one(conn, "get_dataset", {"dataset_uuid": dataset_uuid})
    if row is None:
        return None
    return row, await _all(conn, "dataset_versions", {"dataset_uuid": dataset_uuid})


async def lock_dataset(conn: Conn, dataset_uuid: UUID) -> Row | None:
    return await _one(conn, "lock_dataset", {"dataset_uuid": dataset_uuid})


async def make_version_current(
    conn: Conn, dataset_uuid: UUID, dataset_version: UUID, how: str, now: datetime | None
) -> list[Row]:
    """Make `dataset_version` current, a new one (`how="created"`) or an earlier one again
    (`how="rollback"`); the live tasks canceled as pinned to another version."""
    return await _all(
        conn,
        "make_version_current",
        {"dataset_uuid": dataset_uuid, "dataset_version": dataset_version, "how": how, "now": now},
    )


async def version_exists(conn: Conn, dataset_uuid: UUID, dataset_version: UUID) -> bool:
    params = {"dataset_uuid": dataset_uuid, "dataset_version": dataset_version}
    return await _one(conn, "version_of_dataset", params) is not None


async def lock_pinned_datasets(
    conn: Conn, dataset_uuids: list[UUID], dataset_versions: list[UUID]
) -> dict[UUID, Row]:
    """Share-lock the named datasets: {dataset_uuid: {current_version, named_versions}}."""
    rows = await _all(
        conn,
        "lock_pinned_datasets",
        {"dataset_uuids": dataset_uuids, "dataset_versions": dataset_versions},
    )
    return {row["dataset_uuid"]: row for row in rows}


async def job_trust(conn: Conn, dag_name: str, job_name: str) -> Row | None:
    """The job's {operator, trust}; None when no such job is applied."""
    return await _one(conn, "job_trust", {"dag_name": dag_name, "job_name": job_name})


async def job_scope(conn: Conn, dag_name: str, job_name: str) -> Row | None:
    """The job's {operator, trust, input_datasets} (the datasets it declares as inputs); None
    when no such job is applied."""
    return await _one(conn, "job_scope", {"dag_name": dag_name, "job_name": job_name})


async def list_events(conn: Conn, params: dict[str, Any]) -> list[Row]:
    return await _all(conn, "list_events", params)


async def task_events(conn: Conn, params: dict[str, Any]) -> list[Row]:
    return await _all(conn, "task_events", params)
