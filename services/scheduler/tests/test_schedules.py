"""Cron schedules of jobs: exactly one run per job and tick, with two scheduler replicas and across
a restart; ticks missed while no scheduler ran collapse into one run; a deleted DAG stops."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from structlog.testing import capture_logs

from taskplat.common.clock import FakeClock
from taskplat.testkit.dispatcher_harness import serve_dispatcher

START = datetime.fromisoformat("2030-01-01T00:00:00+00:00")
DAG = {
    "jobs": {
        "every5": {"operator": "echo", "schedule": "*/5 * * * *", "config": {"n": 1}},
        "hourly": {"operator": "echo", "schedule": "0 * * * *"},
        "manual": {"operator": "echo"},
    }
}


def runs(db_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT job ->> 'name' AS job, idempotency_key, status, config FROM tasks "
            "ORDER BY created_at, idempotency_key"
        ).fetchall()


def keys(db_url: str, job: str = "every5") -> list[str]:
    return [row["idempotency_key"] for row in runs(db_url) if row["job"] == job]


def race(schedulers: list[Any]) -> list[int]:
    """run_once on every scheduler at once; the runs each started."""
    started: list[int] = []
    barrier = threading.Barrier(len(schedulers))

    def go(scheduler: Any) -> None:
        barrier.wait(timeout=10)
        started.append(scheduler.run_once().runs_started)

    threads = [threading.Thread(target=go, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return started


def test_one_run_per_tick_with_two_replicas_and_missed_ticks_collapsing(
    db_url: str, clock: FakeClock, make_scheduler: Callable[..., Any]
) -> None:
    clock.set(START)
    with serve_dispatcher(db_url) as dispatcher:
        dispatcher.clock.set(START + timedelta(minutes=1))
        assert dispatcher.api.put("/dags/cron", json=DAG).status_code == 201
    replicas = [make_scheduler(), make_scheduler()]

    clock.set(START + timedelta(minutes=4, seconds=59))
    assert sum(race(replicas)) == 0  # the first tick after the apply is 00:05
    clock.set(START + timedelta(minutes=5))
    assert sum(race(replicas)) == 1
    assert sum(race(replicas)) == 0  # the same tick again: nothing
    assert keys(db_url) == ["schedule:cron:every5:2030-01-01T00:05:00+00:00"]

    # Down from 00:06 to 00:32: the ticks 00:10 ... 00:30 run once, as 00:30.
    clock.set(START + timedelta(minutes=32, seconds=10))
    assert sum(race(replicas)) == 1
    assert keys(db_url)[-1] == "schedule:cron:every5:2030-01-01T00:30:00+00:00"

    # A restarted scheduler (a new replica) starts nothing already started.
    restarted = make_scheduler()
    assert restarted.run_once().runs_started == 0
    clock.set(START + timedelta(hours=1))
    assert sum(race([restarted, *replicas])) == 2  # every5 at 01:00, hourly at 01:00
    assert keys(db_url, "hourly") == ["schedule:cron:hourly:2030-01-01T01:00:00+00:00"]
    assert len(keys(db_url)) == 3
    every = [row for row in runs(db_url) if row["job"] == "every5"]
    assert all(row["status"] == "Queued" and row["config"] == {"n": 1} for row in every)
    assert keys(db_url, "manual") == []


def test_a_deleted_dag_starts_no_more_runs(
    db_url: str, clock: FakeClock, make_scheduler: Callable[..., Any]
) -> None:
    clock.set(START)
    with serve_dispatcher(db_url) as dispatcher:
        dispatcher.clock.set(START)
        assert dispatcher.api.put("/dags/cron", json=DAG).status_code == 201
        assert dispatcher.api.delete("/dags/cron").status_code == 200
    clock.set(START + timedelta(hours=2))
    assert make_scheduler().run_once().runs_started == 0
    assert runs(db_url) == []


def test_a_stored_schedule_that_never_fires_is_skipped_and_the_others_still_tick(
    db_url: str, clock: FakeClock, make_scheduler: Callable[..., Any]
) -> None:
    """A job row whose schedule produces no tick (February 31, stored by an older dispatcher that
    checked only the syntax) is logged and parked; the batch it was in still starts the others."""
    clock.set(START)
    with serve_dispatcher(db_url) as dispatcher:
        dispatcher.clock.set(START)
        assert dispatcher.api.put("/dags/cron", json=DAG).status_code == 201
    with psycopg.connect(db_url) as conn:
        # As an older apply stored it: the expression and a first tick, due before the others.
        conn.execute(
            "UPDATE jobs SET schedule = '0 0 31 2 *', schedule_next_at = %s "
            "WHERE dag_name = 'cron' AND name = 'hourly'",
            (START + timedelta(minutes=1),),
        )
    scheduler = make_scheduler(schedule_batch_size=2)

    clock.set(START + timedelta(minutes=5))
    with capture_logs() as logs:
        assert scheduler.run_once().runs_started == 1
    assert keys(db_url) == ["schedule:cron:every5:2030-01-01T00:05:00+00:00"]
    (skipped,) = [log for log in logs if log["event"] == "schedule_unusable"]
    assert skipped["job"] == "hourly" and skipped["schedule"] == "0 0 31 2 *"
    assert "never fires" in skipped["error"]

    # Parked: later batches neither pick it nor log it again, and the others keep ticking.
    clock.set(START + timedelta(minutes=10))
    with capture_logs() as logs:
        assert scheduler.run_once().runs_started == 1
    assert not [log for log in logs if log["event"] == "schedule_unusable"]
    assert keys(db_url)[-1] == "schedule:cron:every5:2030-01-01T00:10:00+00:00"
    assert keys(db_url, "hourly") == []
