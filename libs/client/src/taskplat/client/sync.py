"""The synchronous client.

Invariants: one `httpx.Client` per `Client` (close it, or use `with`); every method is one call of
`calls` except `iter_tasks` (follows `next_cursor` until the last page) and `wait` (polls until
the task is Completed, Dead or Canceled, or the timeout passes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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


class Client:
    """`Client(url, api_key)`; both default to TASKPLAT_URL and TASKPLAT_API_KEY."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        transport_: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, key = transport.settings(url, api_key)
        self.retries = retries
        self._http = httpx.Client(
            base_url=self.url,
            headers=transport.headers(key),
            timeout=timeout,
            transport=transport_,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def run(self, call: calls.Call[T]) -> T:
        """Send one call (retrying as its idempotency allows) and parse its answer."""
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, **transport.request_args(call)
                )
            except httpx.TransportError as exc:
                if attempt >= self.retries or not transport.retryable(call, exc):
                    raise transport.unreachable(self.url, exc) from None
                time.sleep(transport.delay(attempt))
                attempt += 1
                continue
            return transport.answer(call, response)

    # ---- tasks ---------------------------------------------------------------------------

    def submit(self, operator: str, **fields: Any) -> TaskView:
        """`POST /tasks`: config, inputs, queue, max_attempts, idempotency_key... as keywords."""
        return self.run(calls.create_task(operator, **fields))

    def submit_many(self, tasks: list[dict[str, Any]]) -> CreateTasksResponse:
        return self.run(calls.create_tasks(tasks))

    def get(self, task_id: str | UUID) -> TaskView:
        return self.run(calls.get_task(task_id))

    def list_tasks(self, **filters: Any) -> TaskList:
        """One page: status, queue, operator, dag, job, cursor, limit."""
        return self.run(calls.list_tasks(**filters))

    def iter_tasks(self, **filters: Any) -> Iterator[TaskView]:
        """Every task matching the filters, newest first, page after page."""
        cursor = filters.pop("cursor", None)
        while True:
            page = self.list_tasks(cursor=cursor, **filters)
            yield from page.tasks
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, task_id: str | UUID) -> TaskView:
        return self.run(calls.cancel_task(task_id))

    def retry(self, task_id: str | UUID, *, repin: bool = False) -> TaskView:
        """Replay a Dead or Canceled task; one pinned to a dataset version that is no longer
        current is refused (409 PinnedVersionNotCurrent) unless `repin` moves it to the current
        versions."""
        return self.run(calls.retry_task(task_id, repin=repin))

    def retry_many(self, ids: list[str | UUID] | None = None, **filters: Any) -> BulkRetryResponse:
        """`POST /tasks/retry` by ids, or by filter (status, queue, operator, dag, job, limit);
        `repin=True` re-pins tasks pinned to a dataset version that is no longer current."""
        return self.run(calls.retry_tasks(ids, **filters))

    def wait(
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
            task = self.get(task_id)
            if on_update is not None:
                on_update(task)
            if task.finished:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskplatError(f"task {task_id} is still {task.status} after {timeout}s")
            time.sleep(poll_seconds)

    # ---- queues and figures ---------------------------------------------------------------

    def queues(self) -> QueueList:
        return self.run(calls.list_queues())

    def queue(self, queue: str) -> QueueView:
        """One queue: depth, running, its limits and their use."""
        return self.run(calls.get_queue(queue))

    def pause(self, queue: str) -> QueueView:
        return self.run(calls.pause_queue(queue))

    def resume(self, queue: str) -> QueueView:
        return self.run(calls.resume_queue(queue))

    def stats(self) -> Stats:
        return self.run(calls.stats())

    # ---- DAGs and datasets ----------------------------------------------------------------

    def apply_dag(self, name: str, document: dict[str, Any]) -> models.DagView:
        return self.run(calls.apply_dag(name, document))

    def dags(self) -> models.DagList:
        return self.run(calls.list_dags())

    def dag(self, name: str) -> models.DagView:
        return self.run(calls.get_dag(name))

    def datasets(self) -> models.DatasetList:
        return self.run(calls.list_datasets())

    def dataset(self, dataset_uuid: str | UUID) -> models.DatasetView:
        return self.run(calls.get_dataset(dataset_uuid))

    def rollback_dataset(
        self, dataset_uuid: str | UUID, dataset_version: str | UUID
    ) -> models.NewVersionResponse:
        """Make an earlier version of a dataset current again; the live tasks pinned to the
        version it replaces are canceled."""
        return self.run(calls.rollback_dataset(dataset_uuid, dataset_version))

    def dataset_events(self, dataset_uuid: str | UUID, **query: Any) -> models.EventList:
        return self.run(calls.dataset_events(dataset_uuid, **query))

    def run_job(self, dag_name: str, job: str, **fields: Any) -> models.TaskView:
        """Start a run of a job (`config`, `inputs`, `idempotency_key`)."""
        return self.run(calls.run_job(dag_name, job, **fields))

    def task_events(self, task_id: str | UUID, *, cursor: str | None = None) -> models.EventList:
        """The events a task emitted, newest first."""
        return self.run(calls.task_events(task_id, cursor=cursor))

    def register_queue(self, queue: str) -> models.QueueView:
        return self.run(calls.register_queue(queue))

    def set_queue_limits(
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
        return self.run(
            calls.set_queue_limits(
                queue,
                concurrency_limit=concurrency_limit,
                key_concurrency_limit=key_concurrency_limit,
                rate_per_second=rate_per_second,
                rate_burst=rate_burst,
            )
        )

    def clear_queue_limits(self, queue: str) -> models.QueueView:
        """Remove every limit of the queue (admin)."""
        return self.run(calls.set_queue_limits(queue))

    def delete_dag(self, name: str) -> models.DeletedDag:
        return self.run(calls.delete_dag(name))

    def new_dataset_version(self, dataset_uuid: str | UUID) -> models.NewVersionResponse:
        return self.run(calls.new_dataset_version(dataset_uuid))

    def create_key(self, name: str, scopes: list[str]) -> models.KeyCreated:
        return self.run(calls.create_key(name, scopes))

    def keys(self) -> models.KeyList:
        return self.run(calls.list_keys())

    def revoke_key(self, name: str) -> models.RevokedKey:
        return self.run(calls.revoke_key(name))

    def audit(self, **filters: Any) -> models.AuditList:
        return self.run(calls.audit_log(**filters))

    def workers(self) -> models.WorkerList:
        return self.run(calls.list_workers())
