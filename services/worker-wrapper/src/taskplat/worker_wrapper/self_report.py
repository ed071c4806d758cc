"""The wrapper's report of itself (worker id, queue, slots, version, running tasks), added to the
dispatcher calls it makes anyway (`task-claim-next`, `heartbeat`) so `GET /workers` lists it.

Invariants: a report rides on at most one call per `interval_seconds` (0: never), so it costs no
extra call and no write per task; the running tasks are those claimed by this wrapper whose
completion was not yet reported (or that were rejected), at most `MAX_RUNNING_REPORTED`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from uuid import UUID

from taskplat.common.contracts import WorkerReport
from taskplat.common.contracts.access import MAX_RUNNING_REPORTED


def wrapper_version() -> str:
    try:
        return version("taskplat-worker-wrapper")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


class SelfReport:
    def __init__(
        self,
        worker_id: str,
        queue: str,
        slots: int,
        *,
        interval_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._worker_id = worker_id
        self._queue = queue
        self._slots = slots
        self._interval = interval_seconds
        self._clock = clock
        self._last: float | None = None
        self._version = wrapper_version()
        self._running: dict[UUID, None] = {}

    def claimed(self, task_ids: Iterable[UUID]) -> None:
        for task_id in task_ids:
            if len(self._running) < MAX_RUNNING_REPORTED:
                self._running[task_id] = None

    def finished(self, task_ids: Iterable[UUID]) -> None:
        for task_id in task_ids:
            self._running.pop(task_id, None)

    def due(self) -> WorkerReport | None:
        """The report to send now, or None when the last one is too recent."""
        if self._interval <= 0:
            return None
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            return None
        self._last = now
        return WorkerReport(
            worker_id=self._worker_id,
            queues=[self._queue],
            slots=self._slots,
            version=self._version,
            running=list(self._running),
        )
