"""The asynchronous client (the same methods as `Client`, awaited).

Invariants: one `httpx.AsyncClient` per `AsyncClient` (`aclose` it, or use `async with`); every
method is one call of `calls` except `iter_tasks` (follows `next_cursor` until the last page) and
`wait` (polls until the task is Completed, Dead or Canceled, or the timeout passes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar
from uuid import UUID

import httpx

from taskplat.client import calls, models, transport
from taskplat.client.errors import TaskplatError
from taskplat.client.models import (
    BulkRetryResponse,
    CreateTasksResponse,
    QueueList,
    QueueView,
    Stats,
    TaskList,
    TaskView,
)

T = TypeVar("T")


class AsyncClient:
    """`AsyncClient(url, api_key)`; both default to TASKPLAT_URL and TASKPLAT_API_KEY."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        transport_: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, key = transport.settings(url, api_key)
        self.retries = retries
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=transport.headers(key),
            timeout=timeout,
            transport=transport_,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def run(self, call: calls.Call[T]) -> T:
        """Send one call (retrying as its idempotency allows) and parse its answer."""
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method, call.path, **transport.request_args(call)
                )
            except httpx.TransportError as exc:
                if attempt >= self.retries or not transport.retryable(call, exc):
                    raise transport.unreachable(self.url, exc) from None
                await asyncio.sleep(transport.delay(attempt))
                attempt += 1
                continue
            return transport.answer(call, response)

    # ---- tasks ---------------------------------------------------------------------------

    async def submit(self, operator: str, **fields: Any) -> TaskView:
        """`POST /tasks`: config, inputs, queue, max_attempts, idempotency_key... as keywords."""
        return await self.run(calls.create_task(operator, **fields))

    async def submit_many(self, tasks: list[dict[str, Any]]) -> CreateTasksResponse:
        return await self.run(calls.create_tasks(tasks))

    async def get(self, task_id: str | UUID) -> TaskView:
        return await self.run(calls.get_task(task_id))

    async def list_tasks(self, **filters: Any) -> TaskList:
        """One page: status, queue, operator, dag, job, cursor, limit."""
        return await self.run(calls.list_tasks(**filters))

    async def iter_tasks(self, **filters: Any) -> AsyncIterator[TaskView]:
        """Every task matching the filters, newest first, page after page."""
        cursor = filters.pop("cursor", None)
        while True:
            page = await self.list_tasks(cursor=cursor, **filters)
            for task in page.tasks:
                yield task
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel(self, task_id: str | UUID) -> TaskView:
        return await self.run(calls.cancel_task(task_id))

    async def retry(self, task_id: str | UUID, *, repin: bool = False) -> TaskView:
        """Replay a Dead or Canceled task; one pinned to a dataset version that is no longer
        current is refused (409 PinnedVersionNotCurrent) unless `repin` moves it to the current
        versions."""
        return await self.run(calls.retry_task(task_id, repin=repin))

    async def retry_many(
        self, ids: list[str | UUID] | None = None, **filters: Any
    ) -> BulkRetryResponse:
        """`POST /tasks/retry` by ids, or by filter (status, queue, operator, dag, job, limit);
        `repin=True` re-pins tasks pinned to a dataset version that is no longer current."""
        return await self.run(calls.retry_tasks(ids, **filters))

    async def wait(
        self,
        task_id: str | UUID,
        *,
        timeout: float | None = None,
        poll_seconds: float = 0.5,
        on_update: Callable[[TaskView], None] | None = None,
    ) -> TaskView:
        """Poll the task until it is Completed, Dead or Canceled; TaskplatError on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            task = await self.get(task_id)
            if on_update is not None:
                on_update(task)
            if task.finished:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskplatError(f"task {task_id} is still {task.status} after {timeout}s")
            await asyncio.sleep(poll_seconds)

    # ---- queues and figures ---------------------------------------------------------------

    async def queues(self) -> QueueList:
        return await self.run(calls.list_queues())

    async def queue(self, queue: str) -> QueueView:
        """One queue: depth, running, its limits and their use."""
        return await self.run(calls.get_queue(queue))

    async def pause(self, queue: str) -> QueueView:
        return await self.run(calls.pause_queue(queue))

    async def resume(self, queue: str) -> QueueView:
        return await self.run(calls.resume_queue(queue))

    async def stats(self) -> Stats:
        return await self.run(calls.stats())

    # ---- DAGs and datasets ----------------------------------------------------------------

    async def apply_dag(self, name: str, document: dict[str, Any]) -> models.DagView:
        return await self.run(calls.apply_dag(name, document))

    async def dags(self) -> models.DagList:
        return await self.run(calls.list_dags())

    async def dag(self, name: str) -> models.DagView:
        return await self.run(calls.get_dag(name))

    async def datasets(self) -> models.DatasetList:
        return await self.run(calls.list_datasets())

    async def dataset(self, dataset_uuid: str | UUID) -> models.DatasetView:
        return await self.run(calls.get_dataset(dataset_uuid))

    async def rollback_dataset(
        self, dataset_uuid: str | UUID, dataset_version: str | UUID
    ) -> models.NewVersionResponse:
        """Make an earlier version of a dataset current again; the live tasks pinned to the
        version it replaces are canceled."""
        return await self.run(calls.rollback_dataset(dataset_uuid, dataset_version))

    async def dataset_events(self, dataset_uuid: str | UUID, **query: Any) -> models.EventList:
        return await self.run(calls.dataset_events(dataset_uuid, **query))

    async def run_job(self, dag_name: str, job: str, **fields: Any) -> models.TaskView:
        """Start a run of a job (`config`, `inputs`, `idempotency_key`)."""
        return await self.run(calls.run_job(dag_name, job, **fields))

    async def task_events(
        self, task_id: str | UUID, *, cursor: str | None = None
    ) -> models.EventList:
        """The events a task emitted, newest first."""
        return await self.run(calls.task_events(task_id, cursor=cursor))

    async def register_queue(self, queue: str) -> models.QueueView:
        return await self.run(calls.register_queue(queue))

    async def set_queue_limits(
        self,
        queue: str,
        *,
        concurrency_limit: int | None = None,
        key_concurrency_limit: int | None = None,
        rate_per_second: float | None = None,
        rate_burst: int | None = None,
    ) -> models.QueueView:
        """Replace the queue's limits (admin): each None is no limit; `rate_per_second` and
        `rate_burst` go together. Answers the queue with its limits and their use."""
        return await self.run(
            calls.set_queue_limits(
                queue,
                concurrency_limit=concurrency_limit,
                key_concurrency_limit=key_concurrency_limit,
                rate_per_second=rate_per_second,
                rate_burst=rate_burst,
            )
        )

    async def clear_queue_limits(self, queue: str) -> models.QueueView:
        """Remove every limit of the queue (admin)."""
        return await self.run(calls.set_queue_limits(queue))

    async def delete_dag(self, name: str) -> models.DeletedDag:
        return await self.run(calls.delete_dag(name))

    async def new_dataset_version(self, dataset_uuid: str | UUID) -> models.NewVersionResponse:
        return await self.run(calls.new_dataset_version(dataset_uuid))

    async def create_key(self, name: str, scopes: list[str]) -> models.KeyCreated:
        return await self.run(calls.create_key(name, scopes))

    async def keys(self) -> models.KeyList:
        return await self.run(calls.list_keys())

    async def revoke_key(self, name: str) -> models.RevokedKey:
        return await self.run(calls.revoke_key(name))

    async def audit(self, **filters: Any) -> models.AuditList:
        return await self.run(calls.audit_log(**filters))

    async def workers(self) -> models.WorkerList:
        return await self.run(calls.list_workers())
