"""The sink loop: buffer messages -> rows of their dataset's table, plus the dataset's event.

Design: `run_once()` is one round. Every `discovery_interval_seconds` it reads the buffered datasets
(`dataset_buffers`), creates the buffer queue and its DLQ (with a redrive policy) of any dataset
whose queues do not exist yet and records their URLs (so new datasets are found without a
restart), and reads the buffers' depth. Then it drains every buffer queue in parallel: one
ReceiveMessage per queue (then more receives without waiting while they come back full, up to
`messages_per_write` messages), one transaction per queue's batch, then the DLQ sends and the
deletes. A round waits for all its queues, so the first receive long-polls only when the last
round found no message in any queue: an idle dataset's long poll never paces a busy one.

Invariants:
  * a batch is written in one transaction that holds the dataset's current table row
    (`FOR UPDATE`): rows are inserted with ON CONFLICT (org_id, dedupe_key) DO NOTHING, and when
    any row was inserted the dataset's event (cursor = the table's new high mark `row_id`) is
    stored in the same transaction, whose trigger writes its `route_event` outbox row. Messages are
    deleted only after the commit, so a sink killed at any point loses nothing (the message comes
    back after its visibility timeout) and writes nothing twice (the unique key);
  * one writer per dataset at a time (the lock), so a dataset's cursors only grow and every row up
    to an event's cursor is committed when the event is, whichever replica wrote it;
  * a message that cannot be written goes to the buffer's DLQ with the reason as the message
    attribute `reason` (and `detail`), and is deleted only once the DLQ accepted it; the rest of
    the batch is written. Reasons: `MalformedMessage` (not a JSON object with `dataset_uuid`,
    `schema_hash` and a non-empty `records` array), `UnknownDataset` (not this buffer's dataset, or
    a dataset without a table), `SchemaMismatch` (not the current version's schema hash),
    `MalformedRecord` (a record the schema refuses), `RejectedByDatabase` (Postgres refused the
    message's rows; written in a savepoint, so the others still commit);
  * an error on one queue (SQS or the database) is logged and leaves that queue's messages for a
    later round; the other queues are served.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from botocore.exceptions import BotoCoreError, ClientError
from psycopg import Connection
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from taskplat.common.buffered import BadRecord, Column, buffer_queue_names, check_record
from taskplat.common.clock import Clock, SystemClock
from taskplat.common.logging import get_logger
from taskplat.common.loops import LoopHealth, run_loop
from taskplat.common.telemetry import Telemetry
from taskplat.sink import repository as repo
from taskplat.sink.metrics import SinkMetrics
from taskplat.sink.settings import SinkSettings

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient
else:
    SQSClient = Any

LOOP_NAME = "sink"
MAX_DETAIL_CHARS = 500


@dataclass(frozen=True, slots=True)
class SinkRound:
    queues: int
    messages: int
    written: int
    duplicates: int
    dead_lettered: int
    events: int
    failed_queues: int = field(default=0, kw_only=True)
    more: bool


@dataclass(frozen=True, slots=True)
class Buffer:
    dataset_uuid: UUID
    queue_url: str
    dlq_url: str


@dataclass(frozen=True, slots=True)
class Message:
    receipt_handle: str
    body: str
    sent_at: float | None


@dataclass(frozen=True, slots=True)
class Parsed:
    message: Message
    schema_hash: str
    records: list[Any]


@dataclass
class _Outcome:
    messages: int = 0
    written: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    events: int = 0
    failed: bool = False


class DeadLetter(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Sink:
    def __init__(
        self,
        settings: SinkSettings,
        *,
        pool: ConnectionPool[Connection[DictRow]],
        sqs: SQSClient,
        clock: Clock | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._sqs = sqs
        self._clock: Clock = clock or SystemClock()
        self._telemetry = telemetry
        self.metrics = SinkMetrics(telemetry)
        self.health = LoopHealth()
        self._buffers: list[Buffer] = []
        self._next_discovery = 0.0
        self._busy = False  # the last round received messages: no long polls this round
        self._threads = ThreadPoolExecutor(
            max_workers=settings.concurrency, thread_name_prefix="sink"
        )
        self._log = get_logger().bind(loop=LOOP_NAME)

    # ---- discovery -----------------------------------------------------------------------

    def discover(self) -> list[Buffer]:
        """Create the queues of new buffered datasets, record their URLs, read the depth."""
        with self._pool.connection() as conn:
            rows = repo.buffers(conn)
        buffers: list[Buffer] = []
        for row in rows:
            queue_url, dlq_url = row["queue_url"], row["dlq_url"]
            if queue_url is None:
                try:
                    queue_url, dlq_url = self._create_queues(row["dataset_uuid"])
                except (BotoCoreError, ClientError) as exc:
                    self._log.warning(
                        "buffer_queue_not_created", dataset_uuid=str(row["dataset_uuid"]),
                        error=str(exc),
                    )  # fmt: skip
                    continue
                with self._pool.connection() as conn:
                    repo.set_queue_urls(
                        conn, row["dataset_uuid"], queue_url, dlq_url, self._clock.sql_now()
                    )
                self._log.info(
                    "buffer_queue_created", dataset_uuid=str(row["dataset_uuid"]),
                    queue_url=queue_url,
                )  # fmt: skip
            buffers.append(Buffer(row["dataset_uuid"], queue_url, dlq_url))
        self._buffers = buffers
        self._read_depth(buffers)
        return buffers

    def _create_queues(self, dataset_uuid: UUID) -> tuple[str, str]:
        name, dlq_name = buffer_queue_names(self._settings.sqs_queue_prefix, dataset_uuid)
        dlq_url = self._sqs.create_queue(
            QueueName=dlq_name, Attributes={"MessageRetentionPeriod": "1209600"}
        )["QueueUrl"]
        dlq_arn = self._sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        redrive = {
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": str(self._settings.max_receive_count),
        }
        queue_url = self._sqs.create_queue(
            QueueName=name,
            Attributes={
                "VisibilityTimeout": str(self._settings.visibility_timeout_seconds),
                "RedrivePolicy": json.dumps(redrive),
            },
        )["QueueUrl"]
        return queue_url, dlq_url

    def _read_depth(self, buffers: list[Buffer]) -> None:
        waiting = 0
        for buffer in buffers:
            try:
                attributes = self._sqs.get_queue_attributes(
                    QueueUrl=buffer.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
                )["Attributes"]
            except (BotoCoreError, ClientError):
                continue
            waiting += int(attributes.get("ApproximateNumberOfMessages", 0))
        self.metrics.buffer_messages(waiting)

    # ---- a round -------------------------------------------------------------------------

    def run_once(self) -> SinkRound:
        """Discover when due, then drain one batch of every buffer queue."""
        if time.monotonic() >= self._next_discovery:
            self.discover()
            self._next_discovery = time.monotonic() + self._settings.discovery_interval_seconds
        buffers = list(self._buffers)
        if not buffers:
            return SinkRound(0, 0, 0, 0, 0, 0, more=False)
        random.shuffle(buffers)
        wait = 0 if self._busy else self._settings.wait_time_seconds
        outcomes = list(self._threads.map(lambda buffer: self.drain(buffer, wait), buffers))
        self._busy = any(o.messages for o in outcomes)
        return SinkRound(
            queues=len(buffers),
            messages=sum(o.messages for o in outcomes),
            written=sum(o.written for o in outcomes),
            duplicates=sum(o.duplicates for o in outcomes),
            dead_lettered=sum(o.dead_lettered for o in outcomes),
            events=sum(o.events for o in outcomes),
            failed_queues=sum(1 for o in outcomes if o.failed),
            # The long polls pace the loop while buffers exist.
            more=True,
        )

    def drain(self, buffer: Buffer, wait: int) -> _Outcome:
        """One batch of one buffer queue (its first receive waits `wait` seconds); errors are
        logged and leave the messages queued."""
        try:
            return self._drain(buffer, wait)
        except (BotoCoreError, ClientError, psycopg.Error) as exc:
            self._log.warning(
                "buffer_drain_failed", dataset_uuid=str(buffer.dataset_uuid), error=str(exc)
            )
            return _Outcome(failed=True)

    def _drain(self, buffer: Buffer, wait: int) -> _Outcome:
        messages = self._receive(buffer, wait)
        outcome = _Outcome(messages=len(messages))
        if not messages:
            return outcome
        dead: list[tuple[Message, DeadLetter]] = []
        parsed: list[Parsed] = []
        for message in messages:
            try:
                parsed.append(_parse(message, buffer.dataset_uuid))
            except DeadLetter as exc:
                dead.append((message, exc))
        written: list[Message] = []
        if parsed:
            written, more_dead = self._write(buffer.dataset_uuid, parsed, outcome)
            dead += more_dead
        now = time.time()
        for message in written:
            if message.sent_at is not None:
                self.metrics.buffer_age(now - message.sent_at)
        done = list(written)
        for message, reason in dead:
            if self._dead_letter(buffer, message, reason):
                done.append(message)
                outcome.dead_lettered += 1
        self._delete(buffer, done)
        return outcome

    def _receive(self, buffer: Buffer, wait: int) -> list[Message]:
        """One receive waiting `wait` seconds, then more without waiting while they come back
        full, up to `messages_per_write` messages."""
        settings = self._settings
        received = self._receive_once(buffer, wait)
        while (
            len(received) % settings.receive_max_messages == 0
            and received
            and len(received) + settings.receive_max_messages <= settings.messages_per_write
        ):
            more = self._receive_once(buffer, 0)
            received += more
            if len(more) < settings.receive_max_messages:
                break
        return received

    def _receive_once(self, buffer: Buffer, wait: int) -> list[Message]:
        answer = self._sqs.receive_message(
            QueueUrl=buffer.queue_url,
            MaxNumberOfMessages=self._settings.receive_max_messages,
            WaitTimeSeconds=wait,
            MessageSystemAttributeNames=["SentTimestamp"],
        )
        return [
            Message(
                receipt_handle=item["ReceiptHandle"],
                body=item.get("Body", ""),
                sent_at=_sent_at(item.get("Attributes", {})),
            )
            for item in answer.get("Messages", [])
        ]

    def _write(
        self, dataset_uuid: UUID, parsed: list[Parsed], outcome: _Outcome
    ) -> tuple[list[Message], list[tuple[Message, DeadLetter]]]:
        """Write the messages in one transaction; (written, dead-lettered)."""
        written: list[Message] = []
        dead: list[tuple[Message, DeadLetter]] = []
        inserted = records = 0
        with self._pool.connection() as conn, conn.transaction():
            table = repo.lock_current_table(conn, dataset_uuid)
            if table is None:
                reason = DeadLetter("UnknownDataset", f"dataset {dataset_uuid} has no table")
                return [], [(item.message, reason) for item in parsed]
            columns = [Column(c["name"], c["type"]) for c in table["columns"]]
            for item in parsed:
                try:
                    _check(item, table["schema_hash"], columns)
                    with conn.transaction():  # a savepoint: a refused message leaves the others
                        inserted += repo.insert_records(
                            conn, table["table_name"], columns, item.records
                        )
                except DeadLetter as exc:
                    dead.append((item.message, exc))
                    continue
                except psycopg.DataError as exc:
                    dead.append((item.message, DeadLetter("RejectedByDatabase", str(exc))))
                    continue
                records += len(item.records)
                written.append(item.message)
            if inserted:
                repo.store_event(
                    conn,
                    dataset_uuid=dataset_uuid,
                    dataset_version=table["dataset_version"],
                    cursor=repo.high_mark(conn, table["table_name"]),
                    now=self._clock.sql_now(),
                )
        outcome.written += inserted
        outcome.duplicates += records - inserted
        outcome.events += 1 if inserted else 0
        self.metrics.written(inserted, records - inserted, 1 if inserted else 0)
        return written, dead

    def _dead_letter(self, buffer: Buffer, message: Message, reason: DeadLetter) -> bool:
        detail = reason.detail[:MAX_DETAIL_CHARS] or reason.reason
        try:
            self._sqs.send_message(
                QueueUrl=buffer.dlq_url,
                MessageBody=message.body or "(empty)",
                MessageAttributes={
                    "reason": {"DataType": "String", "StringValue": reason.reason},
                    "detail": {"DataType": "String", "StringValue": detail},
                    "dataset_uuid": {
                        "DataType": "String",
                        "StringValue": str(buffer.dataset_uuid),
                    },
                },
            )
        except (BotoCoreError, ClientError) as exc:
            # Left in the buffer: tried again, and after max_receive_count receives SQS moves it.
            self._log.warning("dead_letter_failed", reason=reason.reason, error=str(exc))
            return False
        self.metrics.dead_lettered(reason.reason)
        self._log.info(
            "message_dead_lettered", dataset_uuid=str(buffer.dataset_uuid),
            reason=reason.reason, detail=detail,
        )  # fmt: skip
        return True

    def _delete(self, buffer: Buffer, messages: list[Message]) -> None:
        for start in range(0, len(messages), 10):
            chunk = messages[start : start + 10]
            answer = self._sqs.delete_message_batch(
                QueueUrl=buffer.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m.receipt_handle} for i, m in enumerate(chunk)
                ],
            )
            for failure in answer.get("Failed", []):
                # Received again later: its rows are duplicates then, skipped.
                self._log.warning("buffer_delete_failed", error=str(failure.get("Message")))

    # ---- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        run_loop(
            LOOP_NAME,
            self.run_once,
            stop,
            interval=self._settings.interval_seconds,
            health=self.health,
            telemetry=self._telemetry,
        )

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)


def _sent_at(attributes: Mapping[Any, str]) -> float | None:
    value = attributes.get("SentTimestamp")
    return int(value) / 1000 if value and value.isdigit() else None


def _parse(message: Message, dataset_uuid: UUID) -> Parsed:
    try:
        body = json.loads(message.body)
    except ValueError as exc:
        raise DeadLetter("MalformedMessage", f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise DeadLetter("MalformedMessage", "the body is not a JSON object")
    unknown = sorted(set(body) - {"dataset_uuid", "schema_hash", "records"})
    if unknown:
        raise DeadLetter("MalformedMessage", f"unknown field {unknown[0]!r}")
    records, schema_hash = body.get("records"), body.get("schema_hash")
    if not isinstance(records, list) or not records:
        raise DeadLetter("MalformedMessage", "records must be a non-empty array")
    if not isinstance(schema_hash, str):
        raise DeadLetter("MalformedMessage", "schema_hash must be a string")
    try:
        named = UUID(str(body.get("dataset_uuid")))
    except ValueError:
        raise DeadLetter("MalformedMessage", "dataset_uuid must be a UUID") from None
    if named != dataset_uuid:
        raise DeadLetter(
            "UnknownDataset", f"dataset {named} is not this buffer's dataset ({dataset_uuid})"
        )
    return Parsed(message, schema_hash, records)


def _check(item: Parsed, schema_hash: str, columns: list[Column]) -> None:
    if item.schema_hash != schema_hash:
        raise DeadLetter(
            "SchemaMismatch",
            f"schema_hash {item.schema_hash[:80]!r} is not the dataset's current {schema_hash}",
        )
    for index, record in enumerate(item.records):
        try:
            check_record(columns, record)
        except BadRecord as exc:
            raise DeadLetter("MalformedRecord", f"record {index}: {exc}") from None
