"""Per-token admission: a rate and a number of queries running at once.

Invariants: a token is `(task_id, attempt)`; at most `rate` queries start per token in any
`window` seconds (a sliding log, in this process: with N replicas a token gets at most N times
that); at most `concurrent` run at once per token, and a slot is held until the query's thread has
returned (a query past its time frees it once its sandbox is killed, not before). A refused request
counts for neither. Memory is bounded by dropping the tokens seen least recently.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from uuid import UUID

TokenKey = tuple[UUID, int]


class Admission:
    def __init__(
        self, rate: int, window: float, concurrent: int, max_tokens: int = 100_000
    ) -> None:
        self._rate = rate
        self._window = window
        self._concurrent = concurrent
        self._max_tokens = max_tokens
        self._seen: OrderedDict[TokenKey, deque[float]] = OrderedDict()
        self._running: dict[TokenKey, int] = {}
        self._lock = threading.Lock()

    def admit(self, key: TokenKey, now: float) -> tuple[str, float] | None:
        """None when admitted (a slot taken: call `release`); else (reason, seconds to wait)."""
        with self._lock:
            if self._running.get(key, 0) >= self._concurrent:
                return "too_many_running", 1.0
            log = self._seen.pop(key, None) or deque()
            while log and log[0] <= now - self._window:
                log.popleft()
            self._seen[key] = log
            if len(log) >= self._rate:
                return "rate_limited", log[0] + self._window - now
            log.append(now)
            while len(self._seen) > self._max_tokens:
                self._seen.popitem(last=False)
            self._running[key] = self._running.get(key, 0) + 1
            return None

    def release(self, key: TokenKey) -> None:
        with self._lock:
            left = self._running.get(key, 0) - 1
            if left > 0:
                self._running[key] = left
            else:
                self._running.pop(key, None)

    def running(self, key: TokenKey) -> int:
        with self._lock:
            return self._running.get(key, 0)
