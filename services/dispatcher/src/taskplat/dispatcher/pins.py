"""Pins of new tasks: the dataset versions a task of a job reads (docs/ARCHITECTURE.md "Pins,
versions and rollback").

Invariants:
  * an input entry of a task of a job that names a `dataset_uuid` is a dataset read: the dataset
    must exist and a `dataset_version` the entry names must be one of its versions (422 naming the
    entry otherwise); an entry naming no version gets its dataset's current one written into the
    task's inputs. The task's pins (`task_pins`) are then written from those entries by the
    statement that writes the task (`taskplat_input_pins`);
  * the datasets are share-locked before their current versions are read, in the transaction that
    writes the task: a concurrent version change waits for that commit, then cancels the task if
    it pinned the version that stopped being current; a change that committed first is seen.
  * a task that will run untrusted (its job says `trust: untrusted`, or its operator is one of
    `untrusted_operators`) may pin only the datasets its job declares as inputs, at any of their
    versions (none, for a task of no job): its capability token grants exactly its pins, so a
    `submit` key must not widen what an `operate` key applied. Anything else is a 422 naming the
    dataset (`confine_untrusted`), unless the caller holds `operate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from taskplat.common.contracts.public import JobRef
from taskplat.common.errors import ValidationFailed
from taskplat.dispatcher.repository import dags as repo
from taskplat.dispatcher.settings import DispatcherSettings
from taskplat.dispatcher.untrusted import untrusted

Conn = AsyncConnection[DictRow]


def _uuid(value: object, loc: list[str | int], field: str) -> UUID:
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise ValidationFailed(
        f"{field} must be a UUID",
        detail=[{"loc": [*loc, field], "msg": "not a UUID", "type": "uuid"}],
    )


def dataset_reads(
    inputs: Sequence[Any], loc: list[str | int]
) -> list[tuple[int, UUID, UUID | None]]:
    """(position, dataset_uuid, dataset_version or None) of each entry that names a dataset."""
    reads: list[tuple[int, UUID, UUID | None]] = []
    for position, entry in enumerate(inputs):
        if not isinstance(entry, Mapping) or "dataset_uuid" not in entry:
            continue
        here = [*loc, position]
        dataset = _uuid(entry["dataset_uuid"], here, "dataset_uuid")
        version = entry.get("dataset_version")
        reads.append(
            (
                position,
                dataset,
                None if version is None else _uuid(version, here, "dataset_version"),
            )
        )
    return reads


async def pin_inputs(conn: Conn, inputs: Sequence[Any], loc: list[str | int]) -> list[Any]:
    """`inputs` with each dataset read checked and given its version (the current one when it
    names none); the datasets stay share-locked until the caller's transaction ends."""
    reads = dataset_reads(inputs, loc)
    if not reads:
        return list(inputs)
    locked = await repo.lock_pinned_datasets(
        conn,
        sorted({dataset for _, dataset, _ in reads}),
        sorted({version for _, _, version in reads if version is not None}),
    )
    pinned = list(inputs)
    problems: list[dict[str, Any]] = []
    for position, dataset, version in reads:
        row = locked.get(dataset)
        if row is None:
            problems.append(
                {
                    "loc": [*loc, position, "dataset_uuid"],
                    "msg": f"no dataset {dataset}",
                    "type": "unknown_dataset",
                }
            )
        elif version is None:
            pinned[position] = {**inputs[position], "dataset_version": str(row["current_version"])}
        elif version not in row["named_versions"]:
            problems.append(
                {
                    "loc": [*loc, position, "dataset_version"],
                    "msg": f"{version} is not a version of dataset {dataset}",
                    "type": "unknown_version",
                }
            )
    if problems:
        raise ValidationFailed("; ".join(p["msg"] for p in problems), detail=problems)
    return pinned


async def confine_untrusted(
    conn: Conn,
    settings: DispatcherSettings,
    operator: str | None,
    job: JobRef | None,
    inputs: Sequence[Any],
    loc: list[str | int],
    *,
    may_widen: bool,
) -> None:
    """422 naming each dataset a task that will run untrusted pins outside its job's declared
    inputs (`operator` None: the job's own). `may_widen`: the caller holds `operate`."""
    if may_widen:
        return
    reads = dataset_reads(inputs, loc)
    if not reads:
        return
    scope = await repo.job_scope(conn, job.dag_name, job.name) if job is not None else None
    runs_as = operator if operator is not None else (scope["operator"] if scope else "")
    if not untrusted(settings, runs_as, str(scope["trust"]) if scope else None):
        return
    declared = set(scope["input_datasets"]) if scope else set()
    where = f"job {job.dag_name}/{job.name}" if job is not None else "a task of no job"
    outside = [(position, dataset) for position, dataset, _ in reads if dataset not in declared]
    if outside:
        messages = [
            f"dataset {dataset} is not an input of {where}, which runs untrusted"
            for _, dataset in outside
        ]
        problems = [
            {
                "loc": [*loc, position, "dataset_uuid"],
                "msg": message,
                "type": "untrusted_pin",
                "dataset_uuid": str(dataset),
            }
            for (position, dataset), message in zip(outside, messages, strict=True)
        ]
        raise ValidationFailed(
            "; ".join(messages)
            + ": an untrusted task may pin only the datasets its job declares as inputs "
            "(pinning another needs the 'operate' scope)",
            detail=problems,
        )
