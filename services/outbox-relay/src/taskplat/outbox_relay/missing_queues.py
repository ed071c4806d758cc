"""Task queues whose SQS queue does not exist, held as one by the relay (migration 0025).

Invariants:
  * a queue is held when SendMessageBatch to its SQS queue answers that the queue does not exist
    (QueueDoesNotExist / AWS.SimpleQueueService.NonExistentQueue): `hold()` records it, in the
    batch's transaction, with the rows of that send pushed to its first probe, so one failed call
    holds the queue and no row of it backs off, or is sent, on its own;
  * while held, the relay's claim (`outbox.claim_pending`) defers every wake-up of the queue to its
    next probe without sending it; the task stays Queued, claimable by claim-next and waiting
    claims; the scheduler does not re-announce it;
  * `probe_due()` takes the held queues whose probe is due (one relay each, for a lease), asks
    SQS (GetQueueUrl) outside any transaction, and either resumes the queue (its deferred
    wake-ups come due and the relay loops are woken) or sets the next probe after twice the last
    wait, up to `missing_queue_probe_max_seconds`. A probe that cannot tell (SQS unreachable)
    counts as still missing. Only `enqueue_task` rows are held: a missing dead-letter record
    queue is not a task queue, its rows keep their own backoff;
  * counters: `taskplat.queue.sqs_holds{queue}` holds begun, `taskplat.queue.sqs_probes{queue,
    found}` probes made; the dispatcher's gauge `taskplat.queues.sqs_missing` counts held queues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.logging import get_logger
from taskplat.common.telemetry import Telemetry
from taskplat.outbox_relay.metric_specs import QUEUE_SQS_HOLDS, QUEUE_SQS_PROBES
from taskplat.outbox_relay.outbox import Failure, Q
from taskplat.outbox_relay.sender import Sender
from taskplat.outbox_relay.settings import RelaySettings

Conn = Connection[DictRow]


@dataclass(frozen=True, slots=True)
class Probed:
    resumed: list[str]
    still_missing: list[str]


class MissingQueues:
    def __init__(
        self,
        settings: RelaySettings,
        sender: Sender,
        sqs_name: Callable[[str], str],
        telemetry: Telemetry | None = None,
    ) -> None:
        self._settings = settings
        self._sender = sender
        self._sqs_name = sqs_name
        self._log = get_logger()
        self._holds: Any = None
        self._probes: Any = None
        if telemetry is not None:
            self._holds = telemetry.counter(QUEUE_SQS_HOLDS)
            self._probes = telemetry.counter(QUEUE_SQS_PROBES)

    def hold(
        self, conn: Conn, queues: Iterable[str], failures: list[Failure], now: datetime | None
    ) -> tuple[set[str], list[str]]:
        """Hold `queues` (task queue names) and push `failures` (their rows) to the first probe,
        in the caller's transaction; returns the queues held (a name the registry cannot hold
        is not: its rows are the caller's to back off) and those this call began to hold."""
        names = sorted(set(queues))
        if not names:
            return set(), []
        rows = conn.execute(
            Q["hold_missing_queues"],
            {
                "queues": names,
                "ids": [failure.outbox_id for failure in failures],
                "errors": [failure.error for failure in failures],
                "probe_base_seconds": self._settings.missing_queue_probe_base_seconds,
                "now": now,
            },
        ).fetchall()
        newly = [row["queue"] for row in rows if row["newly"]]
        for row in rows:
            if row["newly"]:
                self._log.warning(
                    "queue_held_sqs_missing", queue=row["queue"], next_probe_at=row["next_probe_at"]
                )
        return {row["queue"] for row in rows}, newly

    def counted(self, newly: Iterable[str]) -> None:
        """Count holds once their transaction committed."""
        if self._holds is not None:
            for queue in newly:
                self._holds.add(1, {"queue": queue})

    def probe_due(self, pool: ConnectionPool[Conn], now: datetime | None) -> Probed:
        """Probe every held queue whose probe is due; resume those whose SQS queue exists."""
        with pool.connection() as conn:
            due = conn.execute(
                Q["due_probes"],
                {"lease_seconds": self._settings.missing_queue_probe_lease_seconds, "now": now},
            ).fetchall()
        if not due:
            return Probed([], [])
        found: list[str] = []
        missing: list[str] = []
        for row in due:
            exists = self._sender.probe(self._sqs_name(row["queue"]))
            (found if exists else missing).append(row["queue"])
            if self._probes is not None:
                self._probes.add(1, {"queue": row["queue"], "found": str(bool(exists)).lower()})
        with pool.connection() as conn:
            resumed = [
                row["queue"] for row in conn.execute(Q["found_again"], {"queues": found}).fetchall()
            ]
            if missing:
                conn.execute(
                    Q["still_missing"],
                    {
                        "queues": missing,
                        "probe_base_seconds": self._settings.missing_queue_probe_base_seconds,
                        "probe_max_seconds": self._settings.missing_queue_probe_max_seconds,
                        "now": now,
                    },
                )
        for queue in resumed:
            self._log.info("queue_resumed_sqs_found", queue=queue)
        return Probed(resumed, missing)
