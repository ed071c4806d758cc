"""Per-task rate limit of the broker.

Invariants: at most `limit` requests per task in any `window` seconds (a sliding log per task, in
this process: with N replicas a task gets at most N times that); a refused request is not
counted; memory is bounded by dropping the tasks seen least recently beyond `max_tasks`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from uuid import UUID


class RateLimiter:
    def __init__(self, limit: int, window: float, max_tasks: int = 100_000) -> None:
        self._limit = limit
        self._window = window
        self._max_tasks = max_tasks
        self._seen: OrderedDict[UUID, deque[float]] = OrderedDict()

    def allow(self, task_id: UUID, now: float) -> float | None:
        """None when allowed (and counted); else the seconds until the next one would be."""
        log = self._seen.pop(task_id, None) or deque()
        while log and log[0] <= now - self._window:
            log.popleft()
        self._seen[task_id] = log
        if len(log) >= self._limit:
            return log[0] + self._window - now
        log.append(now)
        while len(self._seen) > self._max_tasks:
            self._seen.popitem(last=False)
        return None
