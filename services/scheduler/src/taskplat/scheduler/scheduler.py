"""The scheduler loop: due delayed tasks and due retries become Queued; lost wake-ups are re-sent;
jobs with a cron schedule get one run per tick (`schedules`).

Invariants:
  * `run_once()` runs three bounded steps, each one statement in its own short transaction (due
    delayed tasks and due retries together, lost wake-ups, scheduled job runs):
    the transition and its `enqueue_task` outbox rows commit together, and the relay is NOTIFYed in
    that same transaction (so it only ever wakes for committed rows).
  * Every transition names the status and attempt it selected (`FOR UPDATE SKIP LOCKED`), so any
    number of replicas may run at once: each task moves exactly once per due event.
  * A retry increments `attempt` on the same row; it never creates a task.
  * Re-publishing sets `last_wakeup_at` to now and leaves `queued_at` alone: `queued_at` keeps
    meaning "when the task became Queued", so schedule lag counts from then.
  * Re-publishing is limited where it is mostly waste: a busy queue (one this replica saw with a
    Running task within the last requeue period: its workers are taking its wake-ups, and under
    a backlog its stale tasks are still waiting their turn in SQS) gets at most
    `republish_busy_limit` re-publications per requeue period from this replica, its oldest
    stale tasks first; an idle queue gets all its stale tasks re-announced each period. No lost
    wake-up starves: its task is re-announced once its turn in the busy budget comes (oldest
    first) or at the latest one period after its queue last had a Running task.
  * Time comes from the injected clock (`clock.sql_now()`; None lets the database decide).
  * Each moved task is logged and counted once, after its step committed (`metrics`); with a
    `Telemetry` the loop also records its batch durations, sizes and errors (`run_loop`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.clock import Clock, SystemClock
from taskplat.common.loops import LoopHealth, Waker, run_loop
from taskplat.common.telemetry import Telemetry
from taskplat.scheduler import repository as repo
from taskplat.scheduler import schedules
from taskplat.scheduler.metrics import (
    PROMOTED,
    REPUBLISHED,
    RETRIED,
    RUN_STARTED,
    SchedulerMetrics,
)
from taskplat.scheduler.settings import SchedulerSettings


@dataclass(frozen=True)
class SchedulerBatch:
    """What one `run_once()` did."""

    promoted: int
    retried: int
    republished: int
    more: bool
    # Runs of scheduled jobs started (one per job and tick).
    runs_started: int = field(default=0, kw_only=True)


Step = Callable[[repo.Conn, datetime | None], list[repo.Row]]


class Scheduler:
    def __init__(
        self,
        pool: ConnectionPool[Connection[DictRow]],
        settings: SchedulerSettings,
        *,
        clock: Clock | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._clock = clock or SystemClock()
        self._telemetry = telemetry
        self._metrics = SchedulerMetrics(telemetry)
        # Busy queues -> when this replica last re-announced one of their tasks (their budget).
        self._busy_republished: dict[str, datetime] = {}
        # Queues -> when this replica last saw one of their tasks Running (busy for a period).
        self._seen_busy: dict[str, datetime] = {}

    def _step(self, event: str, step: Step) -> int:
        now = self._clock.sql_now()
        with self._pool.connection() as conn, conn.transaction():
            rows = step(conn, now)
            repo.notify_outbox(conn, (row["queue"] for row in rows))
        self._metrics.moved(event, rows)
        return len(rows)

    def _queue_due(self) -> tuple[int, int]:
        """Due Scheduled and Failed tasks become Queued in one statement; (promoted, retried)."""
        s = self._settings
        now = self._clock.sql_now()
        with self._pool.connection() as conn, conn.transaction():
            rows = repo.queue_due(
                conn, now=now, promote_limit=s.promote_batch_size, retry_limit=s.retry_batch_size
            )
            repo.notify_outbox(conn, (row["queue"] for row in rows))
        promoted = [row for row in rows if row["moved_from"] == "Scheduled"]
        retried = [row for row in rows if row["moved_from"] == "Failed"]
        self._metrics.moved(PROMOTED, promoted)
        self._metrics.moved(RETRIED, retried)
        return len(promoted), len(retried)

    def _republish(self) -> int:
        """Re-announce stale Queued tasks, within each busy queue's budget for the period."""
        s = self._settings
        at = self._clock.now()
        closed = [
            queue
            for queue, last in self._busy_republished.items()
            if (at - last).total_seconds() < s.requeue_after_seconds
        ]
        for queue in set(self._busy_republished) - set(closed):
            del self._busy_republished[queue]
        moved: list[repo.Row] = []

        def step(conn: repo.Conn, now: datetime | None) -> list[repo.Row]:
            for queue in repo.busy_queues(conn):
                self._seen_busy[queue] = at
            for queue, seen in list(self._seen_busy.items()):
                if (at - seen).total_seconds() >= s.requeue_after_seconds:
                    del self._seen_busy[queue]
            moved[:] = repo.republish_unclaimed(
                conn,
                now=now,
                limit=s.republish_batch_size,
                requeue_after_seconds=s.requeue_after_seconds,
                busy_limit=s.republish_busy_limit,
                closed=closed,
                busy=self._seen_busy,
            )
            return moved

        count = self._step(REPUBLISHED, step)
        for row in moved:
            if row.get("busy"):
                self._busy_republished[row["queue"]] = at
        return count

    def run_once(self) -> SchedulerBatch:
        s = self._settings
        promoted, retried = self._queue_due()
        republished = self._republish()
        runs_started = self._step(
            RUN_STARTED,
            lambda conn, now: schedules.start_due_runs(
                conn,
                now=now,
                limit=s.schedule_batch_size,
                hold_seconds=s.polled_wakeup_delay_seconds,
            ),
        )
        return SchedulerBatch(
            promoted=promoted,
            retried=retried,
            republished=republished,
            runs_started=runs_started,
            more=(
                promoted >= s.promote_batch_size
                or retried >= s.retry_batch_size
                or republished >= s.republish_batch_size
                or runs_started >= s.schedule_batch_size
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
            "scheduler",
            self.run_once,
            stop,
            interval=self._settings.interval_seconds,
            waker=waker,
            health=health,
            telemetry=self._telemetry,
        )
