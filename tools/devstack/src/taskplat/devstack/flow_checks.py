"""Checks of flow control measured from the attempts' own start and end times (the bench's W7
and the chaos run): the most attempts Running at once, each key's share of the starts while
every key had work, and how far starts went beyond a token bucket's bound.

Invariants: pure arithmetic over the times given (seconds, one clock: the database's); an
attempt without an end is still Running; an end at the same instant as a start frees its slot
first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

# Slack of the rate check: the starts' times are the database's, the bucket's too; this only
# absorbs the rounding of timestamps to microseconds.
RATE_SLACK = 1e-3


def max_running(intervals: Sequence[tuple[float, float | None]]) -> int:
    """The most intervals open at once; an end at the same instant as a start closes first (a
    slot freed and taken in the same microsecond is not two Running). An open end counts as
    still Running."""
    events = sorted(
        [(start, 1) for start, _ in intervals]
        + [(end, -1) for _, end in intervals if end is not None]
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def shares_while_all_busy(starts: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Each key's share of the starts up to the moment the first key ran out of work (its last
    start): while every key still had tasks to start."""
    if not starts:
        return {}
    last: dict[str, float] = {}
    for key, at in starts:
        last[key] = max(at, last.get(key, at))
    until = min(last.values())
    counted = Counter(key for key, at in starts if at <= until)
    total = sum(counted.values())
    return {key: round(counted.get(key, 0) / total, 3) for key in sorted(last)}


def rate_excess(starts: Sequence[float], per_second: float, burst: int) -> float:
    """The most starts any window [t_i, t_j] held beyond `burst + per_second x (t_j - t_i)`
    (0 or less: the token bucket held). O(n) over the sorted starts."""
    times = sorted(starts)
    worst = float("-inf")
    best_left = float("-inf")  # max over i <= j of (per_second * t_i - i)
    for j, at in enumerate(times):
        best_left = max(best_left, per_second * at - j)
        worst = max(worst, (j + 1) - per_second * at + best_left - burst)
    return worst if times else 0.0
