"""The relay loop: pending outbox rows -> SQS wake-ups and dead-letter records; events -> the
downstream tasks of the jobs that read them.

Design: one short transaction per batch. `run_once()` opens a transaction, claims up to
`batch_size` due, unsent rows (`FOR UPDATE SKIP LOCKED`, ordered by `outbox_id`), sends them
(SendMessageBatch, 10 entries a call, calls in parallel), marks the accepted rows sent and pushes
the others back, then commits. The row locks live exactly as long as that batch; other replicas skip
locked rows, so several relays share the outbox without coordination.

Invariants:
  * a row is marked sent (`sent_at = now`) only after SQS accepted its message, in the same
    transaction that locked it;
  * a crash (or a lost connection) between the send and the commit rolls the marks back and the rows
    are sent again: delivery is at-least-once, which is harmless because the worker's claim is the
    deduplication point and a wake-up only says "look at this task";
  * a row whose send failed (SQS rejected the entry, the queue does not exist, any send error, or
    the row cannot be turned into a message) is never marked sent: it gets `send_attempts + 1`,
    `last_error`, and `available_at = now + full-jitter backoff`, so it is retried later and never
    blocks the rows behind it;
  * with `skip_not_queued` (the default) an `enqueue_task` row whose task is not Queued when the
    batch is claimed (claimed already, e.g. by a wrapper claiming ahead; canceled; finished;
    pruned) is marked sent with `skipped = true` by the claim statement itself and nothing is sent
    for it. The wake-up guarantee is unchanged: every transition into Queued writes its own
    `enqueue_task` row in the same transaction, so a task Queued when its row is claimed is always
    sent, and a task that becomes Queued again later has a newer pending row. Without the setting
    every row is sent whatever the task's state (a stale wake-up is harmless, only wasted);
  * with it and `hold_depth`, a wake-up whose task has `hold_depth` Queued tasks of its queue
    ahead of it, while that queue's workers claim ahead (a full `task-claim-next` in the last
    2 s), is held: not sent, left pending and due again after twice its age (1 s to
    `hold_max_seconds`). Those workers take the oldest Queued tasks first without wake-ups, so
    the held row is usually skipped when it comes due; if nobody claims ahead any more, or the
    task is near the front, it is sent then. Whatever the depth, a wake-up is held the same way
    while its queue's `polled_until` lies ahead (its workers keep waiting claims on the
    dispatcher, which take the oldest Queued task; migration 0016), and sent once it has
    passed. A held wake-up is delayed, never lost, and counts in `taskplat.outbox.held{kind}`,
    not in `relayed`;
  * a task queue whose SQS queue does not exist is held as one (`missing_queues`): the first
    SendMessageBatch answered QueueDoesNotExist holds it, and the rows of that send, like every
    wake-up of it the claim meets afterwards, wait for its next probe (GetQueueUrl, at most once
    a second per relay, backing off per queue) instead of failing and backing off row by row;
    a probe that finds the SQS queue resumes it. Its tasks stay Queued and claimable;
  * skipped rows count in `taskplat.outbox.skipped{kind}` and, like sent rows, in
    `taskplat.outbox.relayed{kind}` (rows that left the outbox); every SQS API call of the relay's
    client counts once in `taskplat.sqs.requests{op}` (`op` = botocore's snake_case operation
    name, e.g. `send_message_batch`, `get_queue_url`).
  * a `route_event` row is performed, not sent: its event is routed (`routing`) inside the batch's
    transaction, so the downstream tasks, their `enqueue_task` rows and the row marked sent commit
    together; those wake-ups go out in a following batch (the batch reports `more`);
  * `run_once()` returns what it did; `run(stop)` only waits (interval, NOTIFY on
    `taskplat_outbox`, or stop) and calls it, in `loops` threads: like replicas, SKIP LOCKED keeps
    their batches apart, so a row created while one batch is sending and committing is claimed
    by another loop at once instead of waiting for that batch to end. The loops share one
    LISTEN connection, and a notification wakes one waiting loop, not every one.
  * each row is sent inside its own "outbox.send" span, child of the row's stored trace context,
    and its message carries that span's context (`metrics`), so one task attempt is one trace
    from `POST /tasks` through the relay to the worker.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from opentelemetry.trace import Span
from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.clock import Clock, SystemClock
from taskplat.common.db.notify import OUTBOX_CHANNEL, SharedNotifyWaker
from taskplat.common.loops import LoopHealth, Waker, run_loop
from taskplat.common.sqs import sqs_queue_name
from taskplat.common.telemetry import Telemetry
from taskplat.outbox_relay import outbox, routing
from taskplat.outbox_relay.messages import (
    OutgoingMessage,
    UnsendableRow,
    build_message,
    trace_attributes,
)
from taskplat.outbox_relay.metrics import RelayMetrics
from taskplat.outbox_relay.missing_queues import MissingQueues
from taskplat.outbox_relay.outbox import Failure, OutboxRow
from taskplat.outbox_relay.routing import RoutedEvent
from taskplat.outbox_relay.sender import Sender
from taskplat.outbox_relay.settings import RelaySettings

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient
else:
    SQSClient = Any

LOOP_NAME = "outbox_relay"
# How often a relay looks for held queues whose probe is due (one small indexed statement).
PROBE_LOOK_INTERVAL = timedelta(seconds=1)
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class RelayBatch:
    claimed: int
    sent: int
    dead_letters_sent: int
    failed: int
    # Wake-ups marked sent without a message (their task was no longer Queued).
    skipped: int = field(default=0, kw_only=True)
    # Wake-ups held back, still pending (their task deep in a backlog claimed ahead).
    held: int = field(default=0, kw_only=True)
    # Wake-ups of queues held because their SQS queue does not exist, deferred to its probe.
    deferred: int = field(default=0, kw_only=True)
    # Events routed to downstream jobs (`route_event` rows), and the tasks that created.
    routed: int = field(default=0, kw_only=True)
    tasks_created: int = field(default=0, kw_only=True)
    more: bool


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        *,
        pool: ConnectionPool[Connection[DictRow]],
        sqs: SQSClient,
        clock: Clock | None = None,
        rand: random.Random | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._clock: Clock = clock or SystemClock()
        self._rand = rand or random.Random()
        self._sender = Sender(sqs, concurrency=settings.send_concurrency)
        self.health = LoopHealth()
        self._telemetry = telemetry
        self._metrics = RelayMetrics(telemetry)
        self._metrics.watch_sqs(sqs)
        self._missing = MissingQueues(
            settings,
            self._sender,
            lambda queue: sqs_queue_name(settings, queue),
            telemetry,
        )
        self._probe_lock = threading.Lock()
        self._next_probe_look: datetime | None = None
        self._hold = outbox.Hold(
            depth=settings.hold_depth if settings.skip_not_queued else 0,
            max_seconds=settings.hold_max_seconds,
            evidence_seconds=settings.hold_evidence_seconds,
        )

    def run_once(self) -> RelayBatch:
        """Probe held queues when due; claim, send and mark one batch in one transaction."""
        self._probe_held_queues()
        now = self._clock.sql_now()
        spans: dict[int, Span] = {}
        newly_held: list[str] = []
        try:
            with self._pool.connection() as conn, conn.transaction():
                rows = outbox.claim_pending(
                    conn,
                    limit=self._settings.batch_size,
                    now=now,
                    skip_not_queued=self._settings.skip_not_queued,
                    hold=self._hold,
                )
                if not rows:
                    return RelayBatch(0, 0, 0, 0, more=False)
                route_rows = [row for row in rows if row.kind == "route_event"]
                messages = [
                    row
                    for row in rows
                    if row.kind != "route_event" and not row.held and not row.deferred
                ]
                spans = {row.outbox_id: self._metrics.start_span(row) for row in messages}
                routed, route_failures = self._route(conn, route_rows, now)
                accepted, failures, missing = self._send(
                    [row for row in messages if not row.skipped], spans
                )
                done = [row.outbox_id for row in accepted]
                done += [row.outbox_id for row in route_rows] if not route_failures else []
                marked = outbox.mark_sent(conn, done, now=now)
                missing_failures = [f for f in failures if f.outbox_id in missing]
                held_queues, newly_held = self._missing.hold(
                    conn, set(missing.values()), missing_failures, now
                )
                # A row whose queue could not be held backs off on its own, as any failure.
                outbox.mark_failed(
                    conn,
                    [f for f in failures if missing.get(f.outbox_id) not in held_queues]
                    + route_failures,
                    now=now,
                )
        except BaseException as exc:
            for span in spans.values():
                self._metrics.end_span(span, f"batch failed: {type(exc).__name__}: {exc}")
            raise
        self._missing.counted(newly_held)
        self._metrics.routed(routed, self._clock.now())
        errors = {failure.outbox_id: failure.error for failure in failures}
        for outbox_id, span in spans.items():
            self._metrics.end_span(span, errors.get(outbox_id))
        marked_ids = set(marked)
        skipped = [row for row in rows if row.skipped]
        self._metrics.skipped(skipped)
        held = [row for row in rows if row.held]
        deferred = [row for row in rows if row.deferred]
        self._metrics.deferred(deferred)
        self._metrics.held(held)
        self._metrics.relayed(row for row in rows if row.outbox_id in marked_ids or row.skipped)
        dead_letters = sum(1 for row in accepted if row.kind == "dead_letter")
        return RelayBatch(
            claimed=len(rows),
            sent=len(accepted) - dead_letters,
            dead_letters_sent=dead_letters,
            failed=len(failures) + len(route_failures),
            skipped=len(skipped),
            held=len(held),
            deferred=len(deferred),
            routed=len(routed),
            tasks_created=sum(len(event.tasks) for event in routed),
            more=len(rows) >= self._settings.batch_size or any(event.tasks for event in routed),
        )

    def _route(
        self, conn: Connection[DictRow], rows: list[OutboxRow], now: datetime | None
    ) -> tuple[list[RoutedEvent], list[Failure]]:
        """Route the events of `rows` in a savepoint of the batch's transaction. If routing
        fails, nothing of it is kept and every row is pushed back (retried with backoff), so
        the wake-ups of the same batch still go out."""
        if not rows:
            return [], []
        event_ids = [int(row.payload["event_id"]) for row in rows]
        try:
            with conn.transaction():
                routed = routing.route_events(
                    conn,
                    event_ids,
                    now=now,
                    hold_seconds=self._settings.polled_wakeup_delay_seconds,
                )
                return routed, []
        except psycopg.Error as exc:
            error = f"routing failed: {type(exc).__name__}: {exc}"
            return [], [self._failure(row, error) for row in rows]

    def _send(
        self, rows: list[OutboxRow], spans: dict[int, Span]
    ) -> tuple[list[OutboxRow], list[Failure], dict[int, str]]:
        """Send the rows' messages; the rows SQS accepted, a failure for each other row, and the
        wake-ups whose SQS queue does not exist (outbox id -> task queue)."""
        if not rows:
            return [], [], {}
        messages, failures = self._build(rows, spans)
        result = self._sender.send(messages)
        outcome = result.outcome
        by_message = {message.outbox_id: message.queue_name for message in messages}
        by_id = {row.outbox_id: row for row in rows}
        accepted = [by_id[outbox_id] for outbox_id, error in outcome.items() if error is None]
        failures += [
            self._failure(by_id[outbox_id], error)
            for outbox_id, error in outcome.items()
            if error is not None
        ]
        # Only a task queue is held (a missing dead-letter record queue is not one).
        missing = {
            failure.outbox_id: by_id[failure.outbox_id].queue
            for failure in failures
            if by_id[failure.outbox_id].kind == "enqueue_task"
            and by_message.get(failure.outbox_id) in result.missing
        }
        self._metrics.sent(accepted)
        self._metrics.failed(by_id[failure.outbox_id] for failure in failures)
        return accepted, failures, missing

    def _probe_held_queues(self) -> None:
        """At most once a second per relay (whichever loop comes first), probe the held queues
        whose probe is due (`missing_queues`)."""
        now = self._clock.now()
        if not self._probe_lock.acquire(blocking=False):
            return
        try:
            if self._next_probe_look is not None and now < self._next_probe_look:
                return
            self._next_probe_look = now + PROBE_LOOK_INTERVAL
            self._missing.probe_due(self._pool, self._clock.sql_now())
        finally:
            self._probe_lock.release()

    def run(self, stop: threading.Event) -> None:
        """Repeat `run_once` until `stop`, waking on the dispatcher's NOTIFY or the interval, in
        `loops` threads at once (each its own batch transaction; one LISTEN connection wakes one
        waiting loop per notification)."""
        shared = SharedNotifyWaker(
            self._settings.database_url.get_secret_value(),
            OUTBOX_CHANNEL,
            stop,
            loops=self._settings.loops,
        )
        threads = [
            threading.Thread(target=self._run_one, args=(stop, shared), name=f"relay-loop-{index}")
            for index in range(1, self._settings.loops)
        ]
        for thread in threads:
            thread.start()
        try:
            self._run_one(stop, shared)
        finally:
            for thread in threads:
                thread.join()
            shared.close()

    def _run_one(self, stop: threading.Event, waker: Waker) -> None:
        run_loop(
            LOOP_NAME,
            self.run_once,
            stop,
            interval=self._settings.interval_seconds,
            waker=waker,
            health=self.health,
            telemetry=self._telemetry,
        )

    def close(self) -> None:
        self._sender.close()

    def _build(
        self, rows: list[OutboxRow], spans: dict[int, Span]
    ) -> tuple[list[OutgoingMessage], list[Failure]]:
        """Each row's message, carrying the W3C context of the row's span (not the row's own)."""
        messages: list[OutgoingMessage] = []
        failures: list[Failure] = []
        for row in rows:
            span = spans[row.outbox_id]
            try:
                message = build_message(row, self._settings)
            except UnsendableRow as exc:
                failures.append(self._failure(row, exc.message))
                continue
            span.set_attribute("messaging.destination.name", message.queue_name)
            attributes = trace_attributes(self._metrics.carrier(span))
            messages.append(replace(message, attributes=attributes))
        return messages, failures

    def _failure(self, row: OutboxRow, error: str) -> Failure:
        delay = full_jitter_delay(
            self._settings.retry_base_seconds,
            self._settings.retry_max_seconds,
            row.send_attempts + 1,
            self._rand,
        )
        return Failure(row.outbox_id, error[:MAX_ERROR_CHARS], delay)
