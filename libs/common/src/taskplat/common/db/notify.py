"""Wake a loop on a Postgres NOTIFY, with the interval as the fallback.

Invariants: a dedicated autocommit connection LISTENs on the channel; a lost connection is
reopened on the next wait (and the wait falls back to a plain sleep meanwhile), so a NOTIFY is only
ever an accelerator, never needed for correctness. `stop` interrupts a wait within `poll` seconds.

`SharedNotifyWaker` serves several loops of one process from one such connection, read by a
thread of its own: each notification wakes one waiting loop, not all of them (those would each
run a batch, and all but one find it taken). A notification heard while no loop waits is kept
for the next loop that does, at most one per loop, so a loop busy when it came still looks.
"""

from __future__ import annotations

import threading
import time

import psycopg
from psycopg import sql

from taskplat.common.logging import get_logger

OUTBOX_CHANNEL = "taskplat_outbox"
# Only statements that store `invoke_lambda` outbox rows notify it (migration 0014).
INVOKE_CHANNEL = "taskplat_invoke"
# A create whose wake-up is held for the claims waiting on the dispatcher (migration 0016).
QUEUED_CHANNEL = "taskplat_queued"


class PgNotifyWaker:
    def __init__(
        self, database_url: str, channel: str, stop: threading.Event, *, poll: float = 0.5
    ) -> None:
        self._url = database_url
        self._channel = channel
        self._stop = stop
        self._poll = poll
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._log = get_logger().bind(channel=channel)

    def _connect(self) -> psycopg.Connection[tuple[object, ...]] | None:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = psycopg.connect(self._url, autocommit=True, connect_timeout=5)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        except psycopg.Error as exc:
            self._log.warning("listen_failed", error=type(exc).__name__)
            return None
        self._conn = conn
        return conn

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a notification; True if one arrived."""
        return self.heard(timeout) > 0

    def heard(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for notifications; how many arrived (0: none). Every
        notification of the packet that brought the first is counted: none is dropped."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return 0
            conn = self._connect()
            if conn is None:
                self._stop.wait(min(remaining, self._poll))
                continue
            received = 0
            try:
                # Read to the generator's end: it stops after the batch holding the first one.
                for _ in conn.notifies(timeout=min(remaining, self._poll), stop_after=1):
                    received += 1
            except psycopg.Error as exc:
                self._log.warning("listen_lost", error=type(exc).__name__)
                self.close()
            if received:
                return received
        return 0

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class SharedNotifyWaker:
    """One LISTEN connection for `loops` loops, each of which takes it as its `Waker`."""

    def __init__(
        self, database_url: str, channel: str, stop: threading.Event, *, loops: int
    ) -> None:
        self._stop = stop
        self._loops = loops
        self._listener = PgNotifyWaker(database_url, channel, stop)
        self._heard = threading.Condition()
        self._pending = 0
        self._closed = False
        self._thread = threading.Thread(target=self._listen, name=f"listen-{channel}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Notifications heard and kept for loops that were not waiting."""
        with self._heard:
            return self._pending

    def _listen(self) -> None:
        while not self._stop.is_set():
            if heard := self._listener.heard(60.0):
                with self._heard:
                    self._pending = min(self._pending + heard, self._loops)
                    self._heard.notify(heard)
        with self._heard:
            self._heard.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds, or until `stop`; True when a notification woke it."""
        with self._heard:
            self._heard.wait_for(lambda: self._pending > 0 or self._stop.is_set(), timeout)
            if self._pending > 0:
                self._pending -= 1
                return True
            return False

    def close(self) -> None:
        """Idempotent; once `stop` is set, the listening thread ends within its poll."""
        with self._heard:
            if self._closed:
                return
            self._closed = True
        self._thread.join()
        self._listener.close()
