"""Cron schedules of jobs (five fields, UTC), for the dispatcher (validation, first tick) and the
scheduler (one run per tick).

Invariants: only five-field expressions are accepted (minute hour day-of-month month
day-of-week); every instant returned is timezone-aware UTC; `latest_tick(expr, now) <= now <
next_tick(expr, now)`, so a scheduler that was down for several ticks starts one run, for the
latest of them, and resumes at the next one.
"""

from __future__ import annotations

from datetime import UTC, datetime

from croniter import croniter


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
    return None


def next_tick(expression: str, after: datetime) -> datetime:
    """The first tick strictly after `after`."""
    start = after.astimezone(UTC)
    found: datetime = croniter(expression, start).get_next(datetime)
    return found.astimezone(UTC)


def latest_tick(expression: str, now: datetime) -> datetime:
    """The last tick at or before `now`."""
    found: datetime = croniter(expression, next_tick(expression, now)).get_prev(datetime)
    return found.astimezone(UTC)
