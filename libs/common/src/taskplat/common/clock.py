"""The clock every loop and the dispatcher read time from.

Invariant: in production the database clock decides. `SystemClock.sql_now()` returns None, and SQL
uses `coalesce(%(now)s::timestamptz, now())`; a `FakeClock` returns a fixed, settable instant so
tests move time without waiting. `now()` is the Python-side reading of the same clock.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, time-zone aware."""
        ...

    def sql_now(self) -> datetime | None:
        """The instant to pass as `%(now)s` to SQL; None lets the database clock decide."""
        ...


class SystemClock:
    """Wall-clock time in Python; the database's `now()` in SQL."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sql_now(self) -> datetime | None:
        return None


class FakeClock:
    """A settable clock for tests. Thread-safe: servers under test read it from other threads."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def sql_now(self) -> datetime | None:
        return self.now()

    def set(self, instant: datetime) -> None:
        if instant.tzinfo is None:
            raise ValueError("FakeClock needs a time-zone aware instant")
        with self._lock:
            self._now = instant

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now
