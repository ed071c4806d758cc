"""Waiting on a condition with a deadline: the only way tests and tools wait.

Invariant: `wait_for` returns the first truthy value of `check` or raises `TimeoutError` naming
what it waited for; it never sleeps longer than `interval` between checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], *, timeout: float, what: str, interval: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)
