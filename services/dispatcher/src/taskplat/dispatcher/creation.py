"""Creating tasks: the values of a new task, and `POST /tasks/batch`.

Invariants:
  * Every task of a bulk create is validated before anything is written; the tasks, their pins,
    the wake-ups of the Queued ones and their NOTIFY commit in one transaction, written by the
    one function that creates tasks (`taskplat_create_tasks`, migration 0023).
  * An idempotency key already taken (by an earlier task or an earlier item of the same batch)
    creates nothing: its result is the existing task with `created: false`.
  * Unset fields take the operator's defaults, then the global defaults.
  * A task's id is a UUIDv7: ids of tasks created later sort later (to the millisecond), so the
    primary key grows at its right edge instead of touching a random page per insert.
  * A task of a job is pinned to the dataset versions its inputs name (the current one where an
    entry names none; `pins`); untrusted tasks are refused while no capability keys are set.
  * Creations are recorded only after the transaction committed. A task the batch inserted is
    answered as the insert returned it (the task as created, with no attempts and no outputs):
    no second read. A task whose idempotency key was already taken is answered as read after the
    commit.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from uuid_utils.compat import uuid7

from taskplat.common.clock import Clock
from taskplat.common.contracts import CreateTaskRequest, TaskView
from taskplat.common.errors import Conflict, ValidationFailed
from taskplat.common.telemetry import inject
from taskplat.dispatcher import pins, untrusted
from taskplat.dispatcher.operations import QueueRegistry
from taskplat.dispatcher.recorder import Recorder
from taskplat.dispatcher.repository import batch, tasks
from taskplat.dispatcher.settings import DispatcherSettings, OperatorDefaults
from taskplat.dispatcher.views import task_view

Conn = AsyncConnection[DictRow]


def _first(*values: Any) -> Any:
    return next(value for value in values if value is not None)


def check_times(request: CreateTaskRequest, loc: list[str | int]) -> None:
    if (
        request.scheduled_for is not None
        and request.expires_at is not None
        and request.expires_at <= request.scheduled_for
    ):
        raise ValidationFailed(
            "expires_at must be after scheduled_for",
            detail=[{"loc": [*loc, "expires_at"], "msg": "must be after scheduled_for"}],
        )


async def admit_untrusted(
    conn: Conn,
    settings: DispatcherSettings,
    requests: list[CreateTaskRequest],
    loc: list[str | int],
    *,
    may_widen: bool,
    batch: bool,
) -> None:
    """The checks every create makes of untrusted tasks before it writes: capability keys are
    set (`untrusted.check_new_tasks`), and each task's pins stay inside its job's inputs unless
    `may_widen` (`pins.confine_untrusted`). `loc`: where the tasks are in the body, a list of
    them for a `batch`, else the one task."""
    await untrusted.check_new_tasks(conn, settings, requests, loc)
    for index, request in enumerate(requests):
        await pins.confine_untrusted(
            conn,
            settings,
            request.operator,
            request.job,
            request.inputs,
            [*loc, index, "inputs"] if batch else [*loc, "inputs"],
            may_widen=may_widen,
        )


def task_values(request: CreateTaskRequest, settings: DispatcherSettings) -> dict[str, Any]:
    """The column values of a new task (its id included), defaults applied."""
    defaults = settings.operator_defaults.get(request.operator, OperatorDefaults())
    return {
        "task_id": uuid7(),  # time-ordered: see the module docstring
        "queue": request.queue,
        "operator": request.operator,
        "job": Jsonb(request.job.model_dump()) if request.job else None,
        "config": Jsonb(request.config),
        "inputs": Jsonb(request.inputs),
        "max_attempts": _first(
            request.max_attempts, defaults.max_attempts, settings.default_max_attempts
        ),
        "max_processing_attempts": _first(
            request.max_processing_attempts,
            defaults.max_processing_attempts,
            settings.default_max_processing_attempts,
        ),
        "on_exhausted": request.on_exhausted or defaults.on_exhausted or "dead_letter",
        "backoff_base_seconds": _first(
            request.backoff_base_seconds,
            defaults.backoff_base_seconds,
            settings.default_backoff_base_seconds,
        ),
        "backoff_max_seconds": _first(
            request.backoff_max_seconds,
            defaults.backoff_max_seconds,
            settings.default_backoff_max_seconds,
        ),
        "timeout_seconds": request.timeout_seconds or defaults.timeout_seconds,
        "scheduled_for": request.scheduled_for,
        "expires_at": request.expires_at,
        "idempotency_key": request.idempotency_key,
        "priority": request.priority,
        "concurrency_key": request.concurrency_key,
    }


class BulkCreate:
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

    async def create_many(
        self, requests: list[CreateTaskRequest], *, may_widen: bool = False
    ) -> list[tuple[TaskView, bool]]:
        """Create the tasks in one transaction; (view, created) for each, in order. `may_widen`:
        the caller may pin untrusted tasks outside their jobs' inputs (`operate`)."""
        for index, request in enumerate(requests):
            check_times(request, ["body", "tasks", index])
        await self._registry.require({request.queue for request in requests}, ["body", "tasks"])
        values = [task_values(request, self._settings) for request in requests]
        params = {
            **tasks.new_task_params(values),
            "now": self._clock.sql_now(),
            "polled_wakeup_delay_seconds": self._settings.polled_wakeup_delay_seconds,
            "trace_context": tasks.wakeup_trace_context(inject()),
            "notify_held": True,
        }
        wanted: list[UUID] = [each["task_id"] for each in values]
        async with self._pool.connection() as conn:
            await admit_untrusted(
                conn, self._settings, requests, ["body", "tasks"], may_widen=may_widen, batch=True
            )
            async with conn.transaction():
                for index, request in enumerate(requests):
                    loc: list[str | int] = ["body", "tasks", index, "inputs"]
                    if request.job is not None and pins.dataset_reads(request.inputs, loc):
                        params["inputs"][index] = Jsonb(
                            await pins.pin_inputs(conn, request.inputs, loc)
                        )
                rows = await tasks.insert_tasks(conn, params)
                inserted = {row["task_id"] for row in rows}
                taken = [
                    each["idempotency_key"] for each in values if each["task_id"] not in inserted
                ]
                if taken:
                    existing = await batch.find_tasks_by_idempotency_keys(conn, taken)
                    for position, each in enumerate(values):
                        if each["task_id"] not in inserted:
                            found = existing.get(each["idempotency_key"])
                            if found is None:  # pragma: no cover - the conflicting row vanished
                                raise Conflict("idempotency key conflict, try again")
                            wanted[position] = found
            self._recorder.tasks_created(rows)  # committed
            views = {row["task_id"]: task_view(row) for row in rows}
            earlier = [task_id for task_id in dict.fromkeys(wanted) if task_id not in views]
            if earlier:  # idempotency keys already taken: the tasks as they are now
                for task_id, row in (await batch.get_tasks(conn, earlier)).items():
                    views[task_id] = task_view(row)
        return [
            (views[task_id], each["task_id"] in inserted)
            for task_id, each in zip(wanted, values, strict=True)
        ]
