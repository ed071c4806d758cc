"""The relay loop: pending outbox rows -> SQS wake-ups and dead-letter records.

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
  * every `enqueue_task` row is sent, whatever the task's state now (a stale wake-up is harmless);
  * `run_once()` returns what it did; `run(stop)` only waits (interval, NOTIFY on
    `taskplat_outbox`, or stop) and calls it.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.clock import Clock, SystemClock
from taskplat.common.db.notify import OUTBOX_CHANNEL, PgNotifyWaker
from taskplat.common.loops import LoopHealth, run_loop
from taskplat.outbox_relay import outbox
from taskplat.outbox_relay.messages import OutgoingMessage, UnsendableRow, build_message
from taskplat.outbox_relay.outbox import Failure, OutboxRow
from taskplat.outbox_relay.sender import Sender
from taskplat.outbox_relay.settings import RelaySettings

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient
else:
    SQSClient = Any

LOOP_NAME = "outbox_relay"
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class RelayBatch:
    claimed: int
    sent: int
    dead_letters_sent: int
    failed: int
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
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._clock: Clock = clock or SystemClock()
        self._rand = rand or random.Random()
        self._sender = Sender(sqs, concurrency=settings.send_concurrency)
        self.health = LoopHealth()

    def run_once(self) -> RelayBatch:
        """Claim, send and mark one batch in one transaction."""
        now = self._clock.sql_now()
        with self._pool.connection() as conn, conn.transaction():
            rows = outbox.claim_pending(conn, limit=self._settings.batch_size, now=now)
            if not rows:
                return RelayBatch(0, 0, 0, 0, more=False)
            messages, failures = self._build(rows)
            outcome = self._sender.send(messages)
            accepted = [outbox_id for outbox_id, error in outcome.items() if error is None]
            by_id = {row.outbox_id: row for row in rows}
            failures += [
                self._failure(by_id[outbox_id], error)
                for outbox_id, error in outcome.items()
                if error is not None
            ]
            outbox.mark_sent(conn, accepted, now=now)
            outbox.mark_failed(conn, failures, now=now)
        dead_letters = sum(1 for outbox_id in accepted if by_id[outbox_id].kind == "dead_letter")
        return RelayBatch(
            claimed=len(rows),
            sent=len(accepted) - dead_letters,
            dead_letters_sent=dead_letters,
            failed=len(failures),
            more=len(rows) >= self._settings.batch_size,
        )

    def run(self, stop: threading.Event) -> None:
        """Repeat `run_once` until `stop`, waking on the dispatcher's NOTIFY or the interval."""
        waker = PgNotifyWaker(self._settings.database_url.get_secret_value(), OUTBOX_CHANNEL, stop)
        run_loop(
            LOOP_NAME,
            self.run_once,
            stop,
            interval=self._settings.interval_seconds,
            waker=waker,
            health=self.health,
        )

    def close(self) -> None:
        self._sender.close()

    def _build(self, rows: list[OutboxRow]) -> tuple[list[OutgoingMessage], list[Failure]]:
        messages: list[OutgoingMessage] = []
        failures: list[Failure] = []
        for row in rows:
            try:
                messages.append(build_message(row, self._settings))
            except UnsendableRow as exc:
                failures.append(self._failure(row, exc.message))
        return messages, failures

    def _failure(self, row: OutboxRow, error: str) -> Failure:
        delay = full_jitter_delay(
            self._settings.retry_base_seconds,
            self._settings.retry_max_seconds,
            row.send_attempts + 1,
            self._rand,
        )
        return Failure(row.outbox_id, error[:MAX_ERROR_CHARS], delay)
