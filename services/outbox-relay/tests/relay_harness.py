"""Test harness of the outbox relay (not product code).

Invariants: each test gets its own database (`db_url`) and its own uniquely prefixed SQS queues on
the shared real SQS endpoint, so tests never see each other's messages; the relay runs on a
`FakeClock` the test moves; every wait has a deadline (`wait_for`). `TcpForwarder` stands in for an
SQS endpoint that is down and later comes back (a real socket, not a mock).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from taskplat.common.clock import Clock
from taskplat.common.db.queries import parse_queries
from taskplat.common.sqs import ensure_queue, sqs_client, sqs_queue_name
from taskplat.common.telemetry import Telemetry
from taskplat.devstack.waiting import wait_for
from taskplat.outbox_relay.settings import RelaySettings

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient
    from types_boto3_sqs.type_defs import MessageTypeDef
else:
    SQSClient = Any
    MessageTypeDef = dict

_SQL_PATH = Path(__file__).with_name("relay_rows.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))

Row = dict[str, Any]


def make_settings(db_url: str, sqs_endpoint_url: str, **overrides: object) -> RelaySettings:
    """Relay settings with a queue prefix and a dead-letter queue unique to the calling test."""
    prefix = f"t{secrets.token_hex(4)}-"
    values: dict[str, object] = {
        "database_url": db_url,
        "sqs_endpoint_url": sqs_endpoint_url,
        "sqs_queue_prefix": prefix,
        "dead_letter_queue_name": f"{prefix}dead-letters",
        "db_pool_min_size": 1,
        "db_pool_max_size": 4,
        "interval_seconds": 0.05,
        "retry_base_seconds": 1.0,
        "retry_max_seconds": 10.0,
    }
    values.update(overrides)
    return RelaySettings(**values)  # type: ignore[arg-type]


@dataclass
class Rows:
    """Direct database access for setup and inspection; each call commits on its own."""

    db_url: str
    clock: Clock  # rows are written at `clock.sql_now()`: the fake now, or the database's

    def _run(self, name: str, params: dict[str, Any] | None = None) -> list[Row]:
        with psycopg.connect(self.db_url, row_factory=dict_row, autocommit=True) as conn:
            cursor = conn.execute(Q[name], params)
            return cursor.fetchall() if cursor.description else []

    def queued_tasks(
        self,
        queue: str,
        count: int = 1,
        *,
        trace_context: dict[str, str] | None = None,
        notify: bool = False,
    ) -> list[UUID]:
        """Insert `count` Queued tasks of `queue`, each with its `enqueue_task` outbox row."""
        task_ids = [uuid4() for _ in range(count)]
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            conn.execute(
                Q["insert_queued_tasks"],
                {
                    "task_ids": task_ids,
                    "queue": queue,
                    "now": self.clock.sql_now(),
                    "trace_context": Jsonb(trace_context) if trace_context else None,
                },
            )
            if notify:
                conn.execute(Q["notify_outbox"], {"queue": queue})
        return task_ids

    def dead_task(self, queue: str, *, last_error: str | None = "boom") -> UUID:
        """Insert a Dead task and its `dead_letter` outbox row."""
        task_id = uuid4()
        now = self.clock.sql_now()
        with psycopg.connect(self.db_url) as conn:
            conn.execute(
                Q["insert_dead_task"],
                {"task_id": task_id, "queue": queue, "last_error": last_error, "now": now},
            )
            conn.execute(
                Q["insert_dead_letter"], {"task_id": task_id, "now": now, "trace_context": None}
            )
        return task_id

    def raw_outbox(self, kind: str, task_id: UUID, queue: str, payload: dict[str, Any]) -> int:
        rows = self._run(
            "insert_raw_outbox",
            {
                "kind": kind,
                "task_id": task_id,
                "queue": queue,
                "payload": Jsonb(payload),
                "now": self.clock.sql_now(),
            },
        )
        outbox_id: int = rows[0]["outbox_id"]
        return outbox_id

    def outbox(self) -> list[Row]:
        return self._run("outbox_rows")

    def by_task(self) -> dict[UUID, Row]:
        return {row["task_id"]: row for row in self.outbox()}

    def queue(self, name: str) -> Row | None:
        found = self._run("queue_row", {"name": name})
        return found[0] if found else None

    def held_flags(self) -> dict[int, bool]:
        return {row["outbox_id"]: row["held"] for row in self._run("outbox_held")}

    def listeners(self) -> int:
        count: int = self._run("listening_backends")[0]["listeners"]
        return count

    def terminate(self, application_name: str) -> int:
        rows = self._run("terminate_relay_backends", {"application_name": application_name})
        count: int = rows[0]["terminated"]
        return count


@dataclass
class Queues:
    """The test's SQS queues, created and read through the real SQS endpoint."""

    settings: RelaySettings
    client: SQSClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = sqs_client(self.settings)

    def name(self, queue: str) -> str:
        return sqs_queue_name(self.settings, queue)

    def create(self, queue: str) -> str:
        return ensure_queue(self.client, self.name(queue))

    def create_dead_letters(self) -> str:
        return ensure_queue(self.client, self.settings.dead_letter_queue_name)

    def delete(self, queue: str) -> None:
        url = self.client.get_queue_url(QueueName=self.name(queue))["QueueUrl"]
        self.client.delete_queue(QueueUrl=url)

    def receive(self, url: str, expected: int, *, timeout: float = 20) -> list[MessageTypeDef]:
        """Receive (and delete) messages until `expected` arrived, then make sure no more come."""
        received: list[MessageTypeDef] = []

        def enough() -> bool:
            received.extend(self._receive_batch(url, wait_seconds=1))
            return len(received) >= expected

        wait_for(enough, timeout=timeout, what=f"{expected} messages on {url}")
        received.extend(self._receive_batch(url, wait_seconds=0))
        return received

    def _receive_batch(self, url: str, *, wait_seconds: int) -> list[MessageTypeDef]:
        response = self.client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait_seconds,
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if messages:
            self.client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )
        return messages


def task_ids_of(messages: Sequence[MessageTypeDef]) -> list[UUID]:
    return [UUID(json.loads(message["Body"])["task_id"]) for message in messages]


class TcpForwarder:
    """Forwards 127.0.0.1:`port` to `target`: an endpoint that is down, then comes back."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", port))
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="forwarder", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()


def metric_lines(telemetry: Telemetry) -> set[str]:
    """The Prometheus sample lines of `telemetry` (no comments, no blank lines)."""
    text = telemetry.prometheus_text().decode()
    return {line for line in text.splitlines() if line and not line.startswith("#")}
