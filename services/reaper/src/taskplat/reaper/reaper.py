"""The reaper loop: times out leases and deadlines, expires unstarted tasks, prunes old rows.

Invariants:
  * `run_once()` runs bounded steps, each one statement in its own short transaction: timeouts
    (expired leases and overrun deadlines, one statement), expired Queued/Scheduled tasks, then
    pruning of finished tasks and of sent outbox rows.
  * A timeout names the status (`Running`), attempt and lease token it selected with
    `FOR UPDATE SKIP LOCKED`: a completion or heartbeat that holds or has committed on the row
    wins and is never overwritten, and replicas never reap the same attempt twice.
  * A timed-out attempt becomes Failed with `next_retry_at = now + backoff` (the scheduler
    re-queues it) or Dead once its budget is used up: a deadline overrun counts against
    `max_attempts` (`AttemptsExhausted`); an expired lease (a lost worker, not the task's fault)
    counts only against `max_processing_attempts` (`ProcessingAttemptsExceeded`). Its
    history row is closed with the same outcome, and its lease token stays on the task so a late
    success of that attempt can still be accepted by the dispatcher.
  * Every task that becomes Dead writes a `dead_letter` outbox row in the same statement, and the
    relay is NOTIFYed in the same transaction.
  * Only terminal tasks and sent outbox rows are pruned; a Running task is never expired.
  * Jitter comes from the injected `random.Random`, time from the injected clock.
  * Each transition is logged and counted once, after its step committed (`metrics`); with a
    `Telemetry` the loop also records its batch durations, sizes and errors (`run_loop`).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from datetime import datetime

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.clock import Clock, SystemClock
from taskplat.common.loops import LoopHealth, Waker, run_loop
from taskplat.common.telemetry import Telemetry
from taskplat.reaper import repository as repo
from taskplat.reaper.metrics import ReaperMetrics
from taskplat.reaper.settings import ReaperSettings


@dataclass(frozen=True)
class ReaperBatch:
    """What one `run_once()` did."""

    lease_expired: int
    deadline_exceeded: int
    expired: int
    dead_lettered: int
    pruned_tasks: int
    pruned_outbox: int
    more: bool


class Reaper:
    def __init__(
        self,
        pool: ConnectionPool[Connection[DictRow]],
        settings: ReaperSettings,
        *,
        clock: Clock | None = None,
        rand: random.Random | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._clock = clock or SystemClock()
        self._rand = rand or random.Random()
        self._telemetry = telemetry
        self._metrics = ReaperMetrics(telemetry)

    def _jitters(self) -> list[float]:
        return [self._rand.random() for _ in range(self._settings.reap_batch_size)]

    def _timeouts(self, now: datetime | None) -> tuple[list[repo.Row], list[repo.Row]]:
        """One statement times out both kinds; returns (lease rows, deadline rows)."""
        s = self._settings
        with self._pool.connection() as conn, conn.transaction():
            rows = repo.reap_timeouts(
                conn,
                now=now,
                limit=s.reap_batch_size,
                grace_seconds=s.deadline_grace_seconds,
                jitters=self._jitters(),
            )
            repo.notify_outbox(conn, (row["queue"] for row in rows if row["status"] == "Dead"))
        leases = [row for row in rows if row["ended"] == "LeaseExpired"]
        deadlines = [row for row in rows if row["ended"] == "DeadlineExceeded"]
        self._metrics.timed_out("lease", leases)
        self._metrics.timed_out("deadline", deadlines)
        return leases, deadlines

    def _expire(self, now: datetime | None) -> list[repo.Row]:
        with self._pool.connection() as conn, conn.transaction():
            rows = repo.expire_unstarted(conn, now=now, limit=self._settings.expire_batch_size)
            repo.notify_outbox(conn, (row["queue"] for row in rows))
        self._metrics.expired(rows)
        return rows

    def _prune(self, now: datetime | None) -> tuple[int, int]:
        s = self._settings
        with self._pool.connection() as conn:
            with conn.transaction():
                tasks = repo.prune_finished_tasks(
                    conn, now=now, limit=s.prune_batch_size, retention_seconds=s.retention_seconds
                )
            self._metrics.pruned(tasks=tasks)
            with conn.transaction():
                outbox = repo.prune_sent_outbox(
                    conn,
                    now=now,
                    limit=s.outbox_prune_batch_size,
                    retention_seconds=s.outbox_retention_seconds,
                )
        self._metrics.pruned(outbox=outbox)
        return tasks, outbox

    def run_once(self) -> ReaperBatch:
        s = self._settings
        now = self._clock.sql_now()
        leases, deadlines = self._timeouts(now)
        expired = self._expire(now)
        pruned_tasks, pruned_outbox = self._prune(now)
        dead = sum(1 for row in (*leases, *deadlines) if row["status"] == "Dead") + len(expired)
        return ReaperBatch(
            lease_expired=len(leases),
            deadline_exceeded=len(deadlines),
            expired=len(expired),
            dead_lettered=dead,
            pruned_tasks=pruned_tasks,
            pruned_outbox=pruned_outbox,
            more=(
                len(leases) + len(deadlines) >= s.reap_batch_size
                or len(expired) >= s.expire_batch_size
                or pruned_tasks >= s.prune_batch_size
                or pruned_outbox >= s.outbox_prune_batch_size
            ),
        )

    def run(
        self,
        stop: threading.Event,
        *,
        waker: Waker | None = None,
        health: LoopHealth | None = None,
    ) -> None:
        """Repeat `run_once` until `stop` is set (see `taskplat.common.loops.run_loop`)."""
        run_loop(
            "reaper",
            self.run_once,
            stop,
            interval=self._settings.interval_seconds,
            waker=waker,
            health=health,
            telemetry=self._telemetry,
        )
