"""Wake a loop on a Postgres NOTIFY, with the interval as the fallback.

Invariants: a dedicated autocommit connection LISTENs on the channel; a lost connection is
reopened on the next wait (and the wait falls back to a plain sleep meanwhile), so a NOTIFY is only
ever an accelerator, never needed for correctness. `stop` interrupts a wait within `poll` seconds.
"""

from __future__ import annotations

import threading
import time

import psycopg
from psycopg import sql

from taskplat.common.logging import get_logger

OUTBOX_CHANNEL = "taskplat_outbox"


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
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            conn = self._connect()
            if conn is None:
                self._stop.wait(min(remaining, self._poll))
                continue
            try:
                for _ in conn.notifies(timeout=min(remaining, self._poll), stop_after=1):
                    return True
            except psycopg.Error as exc:
                self._log.warning("listen_lost", error=type(exc).__name__)
                self.close()
        return False

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
