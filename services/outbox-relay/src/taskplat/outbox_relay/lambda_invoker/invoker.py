"""The Lambda invoker: `invoke_lambda` outbox rows -> a claim made on the function's behalf and
one asynchronous invocation (`InvocationType=Event`) carrying the claim.

A row is performed in ONE transaction, held open around the Invoke call:

    lock the row (SKIP LOCKED) -> claim its task (Queued -> Running, fresh lease token, attempt
    record) -> sign the attempt token -> Invoke -> mark the row sent -> commit

and, when Invoke fails (throttled, refused, unreachable, no answer within
`lambda_invoke_timeout_seconds`), the claim is rolled back to a savepoint and the row gets
`send_attempts + 1`, `last_error` and `available_at = now + full-jitter backoff` instead.

Invariants:
  * a task is claimed for a function only by a transaction that also marks its row sent, and the
    row is marked sent only after Lambda accepted the invocation (202). Whatever the crash point,
    at most one invocation per attempt can act on the task:
      - crash (or lost connection) before Invoke: nothing committed, the row is due again;
      - crash after Invoke, before the commit (or a commit that fails, or an Invoke whose answer
        was lost): the claim never committed. That invocation carries a lease token the task row
        never held, so its heartbeat, events and completion are refused by the dispatcher's lease
        guards; the row is still pending and is performed again with a new claim and a new lease;
      - crash after the commit: the claim and the mark are both durable, the row is never taken
        again; the function holds the only lease.
    The function's first call is a heartbeat (taskplat.lambda_runtime), and nothing runs before
    it is answered. While the relay's transaction is open the task row is locked; a heartbeat
    the committed row refuses waits in the dispatcher for that lock and is judged on the latest
    row: after the commit it holds the lease, after a rollback it is refused. So an invocation
    whose claim did not commit runs no operator code at all, and one whose claim committed is
    never refused for having been too quick;
  * Lambda's own retries are off (`EventInvokeConfig.MaximumRetryAttempts: 0`, the deploy
    template), botocore retries nothing (`total_max_attempts=1`): a failed Invoke is retried
    here only, with backoff, by a new claim;
  * the attempt's deadline is the function's timeout (the task's `timeout_seconds`, which DAG
    validation requires of a `runtime: lambda` job; `lambda_default_timeout_seconds` otherwise)
    and its first lease that timeout plus `lambda_grace_seconds`; from then on the attempt is
    like any other: heartbeats extend the lease, the reaper expires it, the scheduler retries it;
  * a row whose task is not claimable (not Queued, expired, queue paused, gone) is marked sent
    with `skipped` and nothing is invoked; every transition into Queued writes a new row;
  * without attempt-token keys nothing is claimed nor invoked: rows are pushed back with that
    error, visible on the row and in `taskplat.lambda.invocations{outcome="failed"}`;
  * an attempt of an untrusted job (`trust: untrusted`) carries its capability token in the
    invocation payload (never in the function's environment), issued like the dispatcher's claim
    issues it; without capability keys its task is not claimable (the claim takes nothing,
    migration 0024: the task stays Queued and spends no attempt), the row is pushed back with an
    error naming the missing setting and counts in `taskplat.claims.refused{setting}`, so an
    untrusted job never runs without its token;
  * every performed row counts once in `taskplat.lambda.invocations{outcome}` (`invoked`,
    `failed`, `skipped`), after its transaction committed; rows that left the outbox also count in
    `taskplat.outbox.relayed{kind}` (and skipped ones in `taskplat.outbox.skipped{kind}`);
  * this path never touches the SQS batches: `claim_pending` leaves `invoke_lambda` rows alone
    and this loop runs on its own thread and connections;
  * the loop wakes on the `taskplat_invoke` NOTIFY, which only a statement that stored
    `invoke_lambda` rows sends (migration 0014), or on its interval, which is also how rows
    backed off after a failed Invoke come due: the wake-ups of other queues never wake it.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.backoff import full_jitter_delay
from taskplat.common.claim_answer import attempt_token as claim_attempt_token
from taskplat.common.claim_answer import capability_token as claim_capability_token
from taskplat.common.clock import Clock, SystemClock
from taskplat.common.db.notify import INVOKE_CHANNEL, PgNotifyWaker
from taskplat.common.db.queries import load_queries
from taskplat.common.logging import get_logger
from taskplat.common.loops import LoopHealth, run_loop
from taskplat.common.metric_specs import CLAIMS_REFUSED
from taskplat.common.telemetry import Telemetry
from taskplat.common.tokens.attempt import attempt_key_ring
from taskplat.common.tokens.capability import StorageLayout, capability_key_ring
from taskplat.common.tokens.keys import KeyRing
from taskplat.outbox_relay import outbox
from taskplat.outbox_relay.lambda_invoker.client import (
    InvokeFailed,
    function_name,
    invocation_payload,
    invoke_async,
)
from taskplat.outbox_relay.metric_specs import LAMBDA_INVOCATIONS
from taskplat.outbox_relay.metrics import RelayMetrics
from taskplat.outbox_relay.outbox import Failure, OutboxRow
from taskplat.outbox_relay.settings import RelaySettings

if TYPE_CHECKING:
    from types_boto3_lambda.client import LambdaClient
else:
    LambdaClient = Any

Q = load_queries("taskplat.outbox_relay.lambda_invoker", "invoke.sql")

LOOP_NAME = "lambda_invoker"
MAX_ERROR_CHARS = 2000
NO_KEYS = (
    "attempt token keys are not configured (TASKPLAT_ATTEMPT_TOKEN_KEYS and "
    "TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID): a Lambda attempt needs a signed attempt token"
)
CAPABILITY_KEYS_SETTING = "TASKPLAT_CAPABILITY_TOKEN_KEYS"
NO_CAPABILITY_KEYS = (
    f"{CAPABILITY_KEYS_SETTING} is not set: capability token keys are not configured "
    f"({CAPABILITY_KEYS_SETTING} and TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID), and an untrusted job "
    "never runs without its capability token (the task stays Queued)"
)


@dataclass(frozen=True, slots=True)
class InvokerBatch:
    invoked: int
    skipped: int
    failed: int
    more: bool


class Invoker:
    def __init__(
        self,
        settings: RelaySettings,
        *,
        pool: ConnectionPool[Connection[DictRow]],
        client: LambdaClient,
        clock: Clock | None = None,
        rand: random.Random | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._client = client
        self._clock: Clock = clock or SystemClock()
        self._rand = rand or random.Random()
        self._rand_lock = threading.Lock()
        keys = settings.attempt_token_key_settings()
        self._ring: KeyRing | None = attempt_key_ring(keys) if keys is not None else None
        capability_keys = settings.capability_token_key_settings()
        self._capability_ring: KeyRing | None = (
            capability_key_ring(capability_keys) if capability_keys is not None else None
        )
        self._layout = StorageLayout(settings.data_bucket)
        self._grace = timedelta(seconds=settings.lambda_grace_seconds)
        self.health = LoopHealth()
        self._telemetry = telemetry
        self._metrics = RelayMetrics(telemetry)
        self._invocations: Any = (
            telemetry.counter(LAMBDA_INVOCATIONS) if telemetry is not None else None
        )
        self._refused: Any = telemetry.counter(CLAIMS_REFUSED) if telemetry is not None else None
        self._log = get_logger().bind(loop=LOOP_NAME)

    def run_once(self) -> InvokerBatch:
        """Perform up to `lambda_batch_size` due invocations, `lambda_concurrency` at a time,
        each in its own transaction. The first row is looked for on this thread: the threads
        start only once there is one, so a wake-up that finds nothing costs one statement."""
        budget = self._settings.lambda_batch_size
        first = self.invoke_one()
        if first is None:
            return InvokerBatch(invoked=0, skipped=0, failed=0, more=False)
        lock = threading.Lock()
        outcomes: list[str] = [first]

        def worker() -> None:
            while True:
                with lock:
                    if len(outcomes) >= budget:
                        return
                    outcomes.append("pending")
                    index = len(outcomes) - 1
                outcome = self.invoke_one()
                with lock:
                    outcomes[index] = outcome or "none"
                if outcome is None:
                    return

        workers = min(self._settings.lambda_concurrency, budget - 1)
        if workers == 1:
            worker()
        elif workers > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix="lambda-invoke") as executor:
                futures = [executor.submit(worker) for _ in range(workers)]
                for future in futures:
                    future.result()
        return InvokerBatch(
            invoked=outcomes.count("invoked"),
            skipped=outcomes.count("skipped"),
            failed=outcomes.count("failed"),
            more="none" not in outcomes and len(outcomes) >= budget,
        )

    def invoke_one(self) -> str | None:
        """Perform one due invocation row: "invoked", "skipped", "failed", or None (no row)."""
        now = self._clock.sql_now()
        with self._pool.connection() as conn, conn.transaction():
            found = conn.execute(Q["claim_invocation"], {"now": now}).fetchone()
            if found is None:
                return None
            row = OutboxRow(**found)
            outcome = self._perform(conn, row, now)
            if outcome == "skipped":
                conn.execute(Q["mark_skipped"], {"outbox_id": row.outbox_id, "now": now})
            elif outcome == "invoked":
                outbox.mark_sent(conn, [row.outbox_id], now=now)
        # Committed: the claim and the mark (or the back-off) are durable together.
        if outcome == "refused":  # a failure whose task stayed Queued for want of keys
            if self._refused is not None:
                self._refused.add(1, {"setting": CAPABILITY_KEYS_SETTING})
            outcome = "failed"
        self._count(outcome)
        if outcome in ("failed", "limited"):  # the row stays, due again later
            return outcome
        if outcome == "skipped":
            self._metrics.skipped([row])
        else:
            self._log.info("lambda_invoked", task_id=str(row.task_id))
        self._metrics.relayed([row])
        return outcome

    def _perform(self, conn: Connection[DictRow], row: OutboxRow, now: datetime | None) -> str:
        """Claim and invoke inside a savepoint; a failed Invoke rolls the claim back and backs
        the row off ("failed"), and so does a task left for want of capability keys
        ("refused")."""
        if self._ring is None:
            self._fail(conn, row, NO_KEYS, now)
            return "failed"
        try:
            with conn.transaction():  # a savepoint: a failed Invoke undoes the claim
                claimed = self._claim(conn, row, now)
                if claimed is not None:
                    self._invoke(claimed)
        except InvokeFailed as exc:
            self._fail(conn, row, str(exc), now)
            return "failed"
        if claimed is None and self._refused_untrusted(conn, row):
            self._fail(conn, row, NO_CAPABILITY_KEYS, now)
            return "refused"
        if claimed is None and self._held_back(conn, row, now):
            return "limited"
        return "skipped" if claimed is None else "invoked"

    def _held_back(self, conn: Connection[DictRow], row: OutboxRow, now: datetime | None) -> bool:
        """Whether a claim that took nothing left the task Queued because a limit of its queue
        holds it back; the row (the task's only wake-up) then waits `retry_after_ms`, kept."""
        found = conn.execute(Q["queued_limited"], {"task_id": row.task_id, "now": now}).fetchone()
        if found is None:
            return False
        delay = found["retry_after_ms"] / 1000
        conn.execute(Q["hold_back"], {"outbox_id": row.outbox_id, "now": now, "delay": delay})
        self._log.info("lambda_invoke_held_back", task_id=str(row.task_id), reason=found["reason"],
                       retry_after_ms=found["retry_after_ms"])  # fmt: skip
        return True

    def _refused_untrusted(self, conn: Connection[DictRow], row: OutboxRow) -> bool:
        """Whether a claim that took nothing left the task because it runs untrusted and this
        relay has no capability keys (the task is then still Queued: the row is kept)."""
        if self._capability_ring is not None:
            return False
        params = {"task_id": row.task_id, "untrusted_operators": self._settings.untrusted_operators}
        found = conn.execute(Q["queued_untrusted"], params).fetchone()
        return found is not None and bool(found["untrusted"])

    def _claim(
        self, conn: Connection[DictRow], row: OutboxRow, now: datetime | None
    ) -> dict[str, Any] | None:
        params = {
            "task_id": row.task_id,
            "lease_token": uuid4(),
            "function_prefix": self._settings.lambda_function_prefix,
            "default_timeout_seconds": self._settings.lambda_default_timeout_seconds,
            "grace_seconds": self._settings.lambda_grace_seconds,
            "now": now,
            "capability_keys": self._capability_ring is not None,
            "untrusted_operators": self._settings.untrusted_operators,
        }
        return conn.execute(Q["claim_for_function"], params).fetchone()

    def _invoke(self, claimed: dict[str, Any]) -> None:
        assert self._ring is not None
        token = claim_attempt_token(self._ring, claimed, self._grace)
        capability_token = self._capability_token(claimed)
        name = function_name(self._settings, claimed["operator"])
        invoke_async(self._client, name, invocation_payload(claimed, token, capability_token))

    def _capability_token(self, claimed: dict[str, Any]) -> str | None:
        """An untrusted job's capability token (as the dispatcher's claim issues it); never an
        invocation of an untrusted job without one (the claim does not take one without keys:
        this is a second guard)."""
        if claimed.get("trust") != "untrusted":
            return None
        if self._capability_ring is None:
            raise InvokeFailed(NO_CAPABILITY_KEYS)
        return claim_capability_token(self._capability_ring, claimed, self._layout, self._grace)

    def _count(self, outcome: str) -> None:
        if self._invocations is not None:
            self._invocations.add(1, {"outcome": outcome})

    def _fail(
        self, conn: Connection[DictRow], row: OutboxRow, error: str, now: datetime | None
    ) -> None:
        with self._rand_lock:
            delay = full_jitter_delay(
                self._settings.retry_base_seconds,
                self._settings.retry_max_seconds,
                row.send_attempts + 1,
                self._rand,
            )
        outbox.mark_failed(conn, [Failure(row.outbox_id, error[:MAX_ERROR_CHARS], delay)], now=now)
        self._log.warning("lambda_invoke_failed", task_id=str(row.task_id), error=error)

    def run(self, stop: threading.Event) -> None:
        """Repeat `run_once` until `stop`, waking on the invocations' NOTIFY or the interval."""
        waker = PgNotifyWaker(self._settings.database_url.get_secret_value(), INVOKE_CHANNEL, stop)
        run_loop(
            LOOP_NAME,
            self.run_once,
            stop,
            interval=self._settings.interval_seconds,
            waker=waker,
            health=self.health,
            telemetry=self._telemetry,
        )
