"""Cron schedules of jobs: the scheduler starts one run of a job per tick.

Invariants:
  * a run's task carries the idempotency key `schedule:{dag}:{job}:{tick}` (tick in UTC ISO 8601),
    so a tick is started at most once whatever happens: several replicas, a replica that dies
    after starting the run, a DAG re-applied with the same schedule;
  * a scheduler that was down across several ticks starts one run, for the latest tick at or
    before now, and moves the job's next tick past now (missed ticks collapse into one);
  * the run, its wake-up and the job's next tick commit together (the caller's transaction);
  * a stored schedule that produces no tick (one an older dispatcher let through, such as
    February 31) is skipped and logged (`schedule_unusable`) and parked at `NEVER`, so it neither
    fails the batch nor takes a place in every later one; re-applying its DAG replaces it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from psycopg import Connection
from psycopg.rows import DictRow

from taskplat.common.cron import UnusableSchedule, latest_tick, next_tick
from taskplat.common.db.queries import load_queries
from taskplat.common.logging import get_logger

Q = load_queries("taskplat.scheduler", "schedules.sql")

Conn = Connection[DictRow]
Row = dict[str, Any]

# Where a job whose schedule produces no tick is parked (never due).
NEVER = datetime(9999, 12, 31, tzinfo=UTC)


def run_key(dag_name: str, job_name: str, tick: datetime) -> str:
    return f"schedule:{dag_name}:{job_name}:{tick.isoformat()}"


def start_due_runs(
    conn: Conn, *, now: datetime | None, limit: int, hold_seconds: float = 0.0
) -> list[Row]:
    """Start the runs of up to `limit` jobs whose tick has come; the tasks started (`task_id`,
    `attempt`, `queue`, `operator`, `dag_name`, `job`, `tick`). `hold_seconds`: how long a
    run's wake-up is held while its queue's workers wait on a dispatcher."""
    started: list[Row] = []
    for job in conn.execute(Q["due_schedules"], {"now": now, "limit": limit}).fetchall():
        db_now: datetime = job["now"]
        try:
            tick = latest_tick(job["schedule"], db_now)
            next_at = next_tick(job["schedule"], db_now)
        except UnusableSchedule as exc:
            _park(conn, job, str(exc))
            continue
        row = conn.execute(
            Q["start_scheduled_run"],
            {
                "dag_name": job["dag_name"],
                "job_name": job["name"],
                "idempotency_key": run_key(job["dag_name"], job["name"], tick),
                "now": db_now,
                "hold_seconds": hold_seconds,
            },
        ).fetchone()
        conn.execute(
            Q["advance_schedule"],
            {
                "dag_name": job["dag_name"],
                "job_name": job["name"],
                "due_at": job["schedule_next_at"],
                "next_at": next_at,
            },
        )
        if row is not None and row["task_id"] is not None:
            started.append(
                {
                    "task_id": row["task_id"],
                    "attempt": 1,
                    "queue": job["queue"],
                    "operator": job["operator"],
                    "dag_name": job["dag_name"],
                    "job": job["name"],
                    "tick": tick.isoformat(),
                }
            )
    return started


def _park(conn: Conn, job: Row, reason: str) -> None:
    get_logger().warning(
        "schedule_unusable",
        loop="scheduler",
        dag_name=job["dag_name"],
        job=job["name"],
        schedule=job["schedule"],
        error=reason,
    )
    conn.execute(
        Q["advance_schedule"],
        {
            "dag_name": job["dag_name"],
            "job_name": job["name"],
            "due_at": job["schedule_next_at"],
            "next_at": NEVER,
        },
    )
