"""Cron schedules of jobs (five fields, UTC), for the dispatcher (validation, first tick) and the
scheduler (one run per tick). This module is the one home of the rule "what is a usable schedule".

Invariants: only five-field expressions are accepted (minute hour day-of-month month
day-of-week); a usable schedule is one croniter parses *and* that produces a next tick (February
31, or April 31, parse but never fire: `schedule_error` names them "never fires"); every instant
returned is timezone-aware UTC; `latest_tick(expr, now) <= now < next_tick(expr, now)`, so a
scheduler that was down for several ticks starts one run, for the latest of them, and resumes at
the next one; a schedule that cannot produce a tick raises `UnusableSchedule` (never croniter's own
errors), so a caller handles one exception.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from croniter import CroniterBadDateError, CroniterError, croniter


class UnusableSchedule(ValueError):
    """A schedule that produces no tick (it never fires, or croniter cannot compute one)."""


def _reason(expression: str, exc: Exception) -> str:
    if isinstance(exc, CroniterBadDateError):
        return (
            f"schedule {expression!r} never fires: no date matches its day-of-month and month "
            "(such as February 31)"
        )
    return f"schedule {expression!r} cannot produce a next tick: {exc}"


def schedule_error(expression: str) -> str | None:
    """Why `expression` is not a usable schedule, or None when it is."""
    fields = expression.split()
    if len(fields) != 5:
        return (
            f"schedule {expression!r} must have five fields (minute hour day-of-month month "
            f"day-of-week), not {len(fields)}"
        )
    if not croniter.is_valid(expression):
        return f"schedule {expression!r} is not a valid cron expression"
    return _never_fires(expression)


@lru_cache(maxsize=1024)
def _never_fires(expression: str) -> str | None:
    """Whether a syntactically valid expression fires at all. A cron calendar repeats (every 400
    years at most, every 8 for February 29), so one probe from now answers for every instant."""
    try:
        next_tick(expression, datetime.now(UTC))
    except UnusableSchedule as exc:
        return str(exc)
    return None


def next_tick(expression: str, after: datetime) -> datetime:
    """The first tick strictly after `after`; UnusableSchedule when there is none."""
    start = after.astimezone(UTC)
    try:
        found: datetime = croniter(expression, start).get_next(datetime)
    except (CroniterError, ValueError, OverflowError) as exc:
        raise UnusableSchedule(_reason(expression, exc)) from None
    return found.astimezone(UTC)


def latest_tick(expression: str, now: datetime) -> datetime:
    """The last tick at or before `now`; UnusableSchedule when there is none."""
    after = next_tick(expression, now)
    try:
        found: datetime = croniter(expression, after).get_prev(datetime)
    except (CroniterError, ValueError, OverflowError) as exc:
        raise UnusableSchedule(_reason(expression, exc)) from None
    return found.astimezone(UTC)
