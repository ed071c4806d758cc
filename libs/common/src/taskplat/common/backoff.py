"""Exponential backoff with full jitter, capped.

Invariant: for attempt n >= 1 the delay is uniform in [0, min(cap, base * 2**(n-1))). The same
formula lives in SQL as `taskplat_retry_delay()` for task retries (so a retry is one guarded
statement); this module serves the Python callers (the relay's send retries, the wrapper's
dispatcher calls).
"""

from __future__ import annotations

import random


def backoff_ceiling(base_seconds: float, max_seconds: float, attempt: int) -> float:
    """The upper bound of the delay after `attempt` failures (the wait before attempt + 1)."""
    exponent = min(max(attempt - 1, 0), 60)
    return float(min(max_seconds, base_seconds * (2.0**exponent)))


def full_jitter_delay(
    base_seconds: float,
    max_seconds: float,
    attempt: int,
    rand: random.Random | None = None,
) -> float:
    """A delay drawn uniformly from [0, backoff_ceiling(...))."""
    draw = (rand or random).random()
    return draw * backoff_ceiling(base_seconds, max_seconds, attempt)
