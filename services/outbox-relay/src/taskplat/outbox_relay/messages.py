"""What the relay sends for an outbox row: destination SQS queue, body and attributes.

Invariants (pure functions, no I/O):
  * an `enqueue_task` row becomes a wake-up to `sqs_queue_name(settings, row.queue)` whose body is
    exactly `wake_up_body(task_id)`;
  * a `dead_letter` row becomes a `DeadLetterRecord` (validated from the row's payload, its
    `task_id` must match the row's) sent as JSON to `settings.dead_letter_queue_name`;
  * trace context travels only as the String message attributes `traceparent` and `tracestate`,
    never in the body; `build_message` copies the row's, and the relay replaces it with the context
    of its own "outbox.send" span (`taskplat.outbox_relay.metrics`);
  * a row that cannot be turned into a message raises `UnsendableRow`; the relay records the error
    on the row and retries it later, it never drops it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from taskplat.common.contracts.messages import DeadLetterRecord
from taskplat.common.errors import TaskplatError
from taskplat.common.settings import SqsSettings
from taskplat.common.sqs import sqs_queue_name, wake_up_body
from taskplat.outbox_relay.outbox import OutboxRow

if TYPE_CHECKING:
    from types_boto3_sqs.type_defs import MessageAttributeValueTypeDef

TRACE_ATTRIBUTES = ("traceparent", "tracestate")
# Below SQS's 256 KiB limit on the total size of one SendMessageBatch call, with room for names.
MAX_BATCH_BYTES = 240 * 1024
MAX_BATCH_ENTRIES = 10


class UnsendableRow(TaskplatError):
    code = "unsendable_outbox_row"


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    outbox_id: int
    queue_name: str
    body: str
    attributes: dict[str, MessageAttributeValueTypeDef] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Bytes SQS counts against the message size limit (body plus attributes)."""
        size = len(self.body.encode())
        for name, value in self.attributes.items():
            size += len(name.encode()) + len(value["DataType"].encode())
            size += len(value.get("StringValue", "").encode())
        return size


def trace_attributes(
    trace_context: Mapping[str, Any] | None,
) -> dict[str, MessageAttributeValueTypeDef]:
    """`traceparent`/`tracestate` String attributes from a row's trace context (others ignored)."""
    if not trace_context:
        return {}
    attributes: dict[str, MessageAttributeValueTypeDef] = {}
    for name in TRACE_ATTRIBUTES:
        value = trace_context.get(name)
        if isinstance(value, str) and value:
            attributes[name] = {"DataType": "String", "StringValue": value}
    return attributes


def build_message(row: OutboxRow, settings: SqsSettings) -> OutgoingMessage:
    """The SQS message announcing `row`; raises `UnsendableRow` when the row cannot be sent."""
    attributes = trace_attributes(row.trace_context)
    if row.kind == "enqueue_task":
        return OutgoingMessage(
            row.outbox_id,
            sqs_queue_name(settings, row.queue),
            wake_up_body(row.task_id),
            attributes,
        )
    if row.kind == "dead_letter":
        try:
            record = DeadLetterRecord.model_validate(row.payload)
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or '<payload>'}: {error['msg']}"
                for error in exc.errors()
            )
            raise UnsendableRow(f"invalid dead-letter payload: {errors}") from exc
        if record.task_id != row.task_id:
            raise UnsendableRow(
                f"dead-letter payload names task {record.task_id}, the row task {row.task_id}"
            )
        return OutgoingMessage(
            row.outbox_id, settings.dead_letter_queue_name, record.model_dump_json(), attributes
        )
    raise UnsendableRow(f"unknown outbox kind {row.kind!r}")


def chunk_messages(messages: Sequence[OutgoingMessage]) -> Iterator[list[OutgoingMessage]]:
    """Split messages into SendMessageBatch calls: one SQS queue per call, at most 10 entries and
    `MAX_BATCH_BYTES` per call; order within a queue is kept."""
    by_queue: dict[str, list[OutgoingMessage]] = {}
    for message in messages:
        by_queue.setdefault(message.queue_name, []).append(message)
    for queue_messages in by_queue.values():
        chunk: list[OutgoingMessage] = []
        chunk_bytes = 0
        for message in queue_messages:
            too_many = len(chunk) >= MAX_BATCH_ENTRIES
            if chunk and (too_many or chunk_bytes + message.size > MAX_BATCH_BYTES):
                yield chunk
                chunk, chunk_bytes = [], 0
            chunk.append(message)
            chunk_bytes += message.size
        if chunk:
            yield chunk
