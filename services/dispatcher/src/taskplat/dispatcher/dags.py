"""Jobs and DAGs: applying DAG documents (and the datasets they declare), reading and deleting
DAGs, starting runs by hand. Each public call is one transaction. Reading datasets and their
events, and version rollovers, are `datasets.DatasetService`'s.

Invariants:
  * a document is checked whole (`dag_rules`) before anything is written; applying it replaces the
    DAG's jobs, edges and outputs in one transaction under the DAG's lock, and the same document
    again (same hash) writes nothing; the check (which probes every schedule) and the hash run off
    the event loop (`off_loop`);
  * every job names a registered queue (422 naming the known ones otherwise), like `POST /tasks`;
  * datasets are created on first use and never deleted; an output naming an existing dataset of
    another kind is refused (422) and nothing of the document is stored;
  * a job's retry defaults are resolved at apply time (job field, operator defaults, dispatcher
    defaults), so every service that starts a run of it builds the same task;
  * a schedule's first tick is the first one after the apply; re-applying a DAG never re-runs a
    tick that already ran (the scheduler's runs carry a key per job and tick);
  * a buffered dataset's schema change on re-apply makes a new current version, which cancels
    the live tasks pinned to other versions in the same transaction, under the dataset row's lock;
  * a task of a job is pinned to the versions its run's inputs name (`pins`); untrusted jobs are
    refused at apply and run while no capability keys are configured (`untrusted`);
  * a buffered_postgres dataset's current version always has its table, created in the
    transaction that makes the version; a changed declared schema on re-apply is a new version
    with a new table, never DDL on the old one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from taskplat.common.buffered import Column, schema_hash
from taskplat.common.clock import Clock
from taskplat.common.contracts import (
    DagDocument,
    DagList,
    DagSummary,
    DagView,
    JobRunRequest,
    JobSpec,
    JobView,
    TaskView,
)
from taskplat.common.contracts.dags import FromDataset, FromJob
from taskplat.common.contracts.public import JobRef
from taskplat.common.cron import next_tick
from taskplat.common.errors import BadRequest, NotFound, ValidationFailed
from taskplat.common.telemetry import inject
from taskplat.dispatcher import audit, dag_rules, pins, untrusted
from taskplat.dispatcher.audit import AuditCall
from taskplat.dispatcher.operations import QueueRegistry
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import buffered as buffered_repo
from taskplat.dispatcher.repository import dags as repo
from taskplat.dispatcher.repository import tasks as task_repo
from taskplat.dispatcher.requests import off_loop
from taskplat.dispatcher.settings import DispatcherSettings, OperatorDefaults
from taskplat.dispatcher.views import task_view

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


class DagService:
    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        clock: Clock,
        settings: DispatcherSettings,
        recorder: Recorder,
        registry: QueueRegistry,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._settings = settings
        self._recorder = recorder
        self._registry = registry

    # ---- DAGs ----------------------------------------------------------------------------

    async def apply(self, dag_name: str, doc: DagDocument, call: AuditCall) -> tuple[DagView, bool]:
        """Apply a checked document; (view, created)."""
        await off_loop(dag_rules.check_document, doc)
        if not untrusted.capability_keys_configured(self._settings):
            names = [
                f"job {name}"
                for name, job in doc.jobs.items()
                if untrusted.untrusted(self._settings, job.operator, job.trust)
            ]
            if names:
                raise untrusted.refuse(names, ["body", "jobs"])
        await self._registry.require({job.queue for job in doc.jobs.values()}, ["body", "jobs"])
        digest = await off_loop(dag_rules.document_hash, doc)
        now = self._clock.sql_now()
        canceled: list[Row] = []
        async with self._pool.connection() as conn:
            async with conn.transaction():
                stored_hash = await repo.lock_dag(conn, dag_name)
                changed = stored_hash != digest
                if changed:
                    canceled = await self._replace(conn, dag_name, doc, digest, now)
                outcome = (
                    "unchanged"
                    if not changed
                    else "created"
                    if stored_hash is None
                    else ("replaced")
                )
                await audit.record(conn, call, outcome, now=now)
            view = await self._view(conn, dag_name)
        assert view is not None
        for row in canceled:
            self._recorder.task_canceled(row, by="version_rollover")
        if changed:
            self._recorder.dag_applied(dag_name, len(doc.jobs))
        return view.model_copy(update={"changed": changed}), stored_hash is None

    async def _replace(
        self, conn: Conn, dag_name: str, doc: DagDocument, digest: str, now: datetime | None
    ) -> list[Row]:
        """Store the document; the tasks canceled by buffered datasets' schema changes."""
        document = doc.model_dump(mode="json", by_alias=True, exclude_none=True)
        await repo.store_dag(conn, dag_name, document, digest, now)
        datasets, canceled = await self._datasets_of(conn, doc, now)
        wall_now = self._clock.now()
        for name, job in doc.jobs.items():
            await repo.insert_job(conn, self._job_params(dag_name, name, job, wall_now))
            await repo.insert_job_outputs(
                conn,
                dag_name,
                name,
                [(output.index, datasets[output.dataset]) for output in job.outputs],
            )
            await repo.insert_job_inputs(
                conn, dag_name, name, [self._edge(doc, edge, datasets) for edge in job.inputs]
            )
        return canceled

    async def _datasets_of(
        self, conn: Conn, doc: DagDocument, now: datetime | None
    ) -> tuple[dict[str, UUID], list[Row]]:
        found: dict[str, UUID] = {}
        canceled: list[Row] = []
        problems: list[dict[str, Any]] = []
        for plan in dag_rules.dataset_plan(doc):
            if plan.kind is None:
                row = await repo.find_dataset(conn, plan.name)
                if row is None:
                    row = await repo.ensure_dataset(
                        conn,
                        name=plan.name,
                        kind="external",
                        location=dag_rules.DEFAULT_LOCATIONS["external"],
                        now=now,
                    )
            else:
                assert plan.location is not None
                row = await repo.ensure_dataset(
                    conn, name=plan.name, kind=plan.kind, location=plan.location, now=now
                )
                if row["kind"] != plan.kind:
                    problems.append(
                        {
                            "loc": ["body", "jobs"],
                            "msg": f"dataset {plan.name!r} exists with kind {row['kind']!r}, "
                            f"not {plan.kind!r}",
                            "type": "conflicting_kind",
                        }
                    )
                elif plan.columns is not None:
                    canceled += await self._ensure_table(
                        conn, row["dataset_uuid"], list(plan.columns), now
                    )
            found[plan.name] = row["dataset_uuid"]
        if problems:
            raise ValidationFailed("; ".join(p["msg"] for p in problems), detail=problems)
        return found, canceled

    async def _ensure_table(
        self, conn: Conn, dataset_uuid: UUID, columns: list[Column], now: datetime | None
    ) -> list[Row]:
        """Give a buffered dataset's current version its table; a different schema than the
        current table's is a new version with a new table (the old one is never altered).
        Returns the tasks the rollover canceled."""
        locked = await repo.lock_dataset(conn, dataset_uuid)
        assert locked is not None
        current = await buffered_repo.current_table(conn, dataset_uuid)
        if current is not None and current["schema_hash"] == schema_hash(columns):
            return []
        canceled: list[Row] = []
        version = locked["current_version"]
        if current is not None:
            version = uuid4()
            canceled = await repo.make_version_current(conn, dataset_uuid, version, "created", now)
        await buffered_repo.create_table(conn, dataset_uuid, version, columns, now)
        return canceled

    @staticmethod
    def _edge(
        doc: DagDocument, edge: Any, datasets: dict[str, UUID]
    ) -> tuple[UUID, str | None, int | None, str | None]:
        source = edge.from_
        if isinstance(source, FromJob):
            producer = doc.jobs[source.job]
            output = next(o for o in producer.outputs if o.index == source.output_index)
            return datasets[output.dataset], source.job, source.output_index, edge.where
        assert isinstance(source, FromDataset)
        return datasets[source.dataset], None, None, edge.where

    def _job_params(self, dag_name: str, name: str, job: JobSpec, now: datetime) -> dict[str, Any]:
        settings = self._settings
        defaults = settings.operator_defaults.get(job.operator, OperatorDefaults())
        return {
            "dag_name": dag_name,
            "name": name,
            "operator": job.operator,
            "runtime": job.runtime,
            "queue": job.queue,
            "config": job.config,
            "trust": job.trust,
            "priority": job.priority,
            "concurrency_key": job.concurrency_key,
            "on_exhausted": job.on_exhausted or defaults.on_exhausted or "dead_letter",
            "schedule": job.schedule,
            "schedule_next_at": next_tick(job.schedule, now) if job.schedule else None,
            "max_attempts": _first(
                job.max_attempts, defaults.max_attempts, settings.default_max_attempts
            ),
            "backoff_base_seconds": _first(
                job.backoff_base_seconds,
                defaults.backoff_base_seconds,
                settings.default_backoff_base_seconds,
            ),
            "backoff_max_seconds": _first(
                job.backoff_max_seconds,
                defaults.backoff_max_seconds,
                settings.default_backoff_max_seconds,
            ),
            "timeout_seconds": job.timeout_seconds or defaults.timeout_seconds,
        }

    async def get(self, dag_name: str) -> DagView:
        async with self._pool.connection() as conn:
            view = await self._view(conn, dag_name)
        if view is None:
            raise NotFound(f"DAG {dag_name!r} not found")
        return view

    async def _view(self, conn: Conn, dag_name: str) -> DagView | None:
        dag = await repo.get_dag(conn, dag_name)
        if dag is None:
            return None
        jobs, inputs, outputs = await repo.dag_parts(conn, dag_name)
        views = [
            JobView.model_validate(
                {
                    **{key: job[key] for key in JobView.model_fields if key in job},
                    "inputs": [
                        _input_view(edge) for edge in inputs if edge["job_name"] == job["name"]
                    ],
                    "outputs": [
                        {
                            "index": output["output_index"],
                            "dataset": output["dataset"],
                            "dataset_uuid": output["dataset_uuid"],
                            "kind": output["kind"],
                        }
                        for output in outputs
                        if output["job_name"] == job["name"]
                    ],
                }
            )
            for job in jobs
        ]
        return DagView(
            dag_name=dag["dag_name"],
            document_hash=dag["document_hash"],
            created_at=dag["created_at"],
            updated_at=dag["updated_at"],
            jobs=views,
        )

    async def list(self) -> DagList:
        async with self._pool.connection() as conn:
            rows = await repo.list_dags(conn)
        return DagList(dags=[DagSummary.model_validate(row) for row in rows])

    async def delete(self, dag_name: str, call: AuditCall) -> None:
        async with self._pool.connection() as conn:
            async with conn.transaction():
                await repo.lock_dag(conn, dag_name)
                deleted = await repo.delete_dag(conn, dag_name)
                if deleted:
                    await audit.record(conn, call, "deleted", now=self._clock.sql_now())
        if not deleted:
            raise NotFound(f"DAG {dag_name!r} not found")
        self._recorder.dag_deleted(dag_name)

    async def start_run(
        self, dag_name: str, job_name: str, request: JobRunRequest, *, may_widen: bool = False
    ) -> tuple[TaskView, bool]:
        """Start a run of a job by hand; (task, created). A known idempotency key answers the
        existing task. `may_widen`: the caller may pin an untrusted job's run outside the job's
        inputs (`operate`)."""
        inputs = [item.model_dump(mode="json", exclude_none=True) for item in request.inputs]
        params: dict[str, Any] = {
            "dag_name": dag_name,
            "job_name": job_name,
            "config": request.config,
            "idempotency_key": request.idempotency_key,
            "now": self._clock.sql_now(),
            "trace_context": inject(),
            "polled_wakeup_delay_seconds": self._settings.polled_wakeup_delay_seconds,
        }
        async with self._pool.connection() as conn:
            async with conn.transaction():
                if not await repo.job_exists(conn, dag_name, job_name):
                    raise NotFound(f"job {job_name!r} of DAG {dag_name!r} not found")
                await untrusted.check_job_run(conn, self._settings, dag_name, job_name, ["path"])
                await pins.confine_untrusted(
                    conn,
                    self._settings,
                    None,
                    JobRef(dag_name=dag_name, name=job_name),
                    inputs,
                    ["body", "inputs"],
                    may_widen=may_widen,
                )
                params["inputs"] = await pins.pin_inputs(conn, inputs, ["body", "inputs"])
                task_id = await repo.start_job_run(conn, params)
            created = task_id is not None
            if task_id is not None:
                row = await task_repo.get_task(conn, task_id)
            else:
                assert request.idempotency_key is not None
                row = await task_repo.get_task_by_idempotency_key(conn, request.idempotency_key)
                if row is None:  # pragma: no cover - the conflicting row vanished
                    raise BadRequest("idempotency key conflict, try again")
        assert row is not None
        if created:
            self._recorder.task_created(row)
        return task_view(row), created


def _input_view(edge: Row) -> dict[str, Any]:
    source: dict[str, Any] = (
        {"job": edge["from_job"], "output_index": edge["from_output_index"]}
        if edge["from_job"] is not None
        else {"dataset": edge["dataset"]}
    )
    return {
        "from": source,
        "where": edge["where_clause"],
        "dataset": edge["dataset"],
        "dataset_uuid": edge["dataset_uuid"],
    }
