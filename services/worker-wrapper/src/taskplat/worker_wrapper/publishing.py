"""Records an operator publishes to its job's buffered_postgres outputs, sent to their buffer queues
(docs/contracts.md, "Buffered Postgres datasets"). The operator writes
`{"records": [...], "dataset_uuid"}` lines; the wrapper, which holds the AWS credentials, sends
them.

Invariants:
  * records go only to an output of the task's own job whose kind is buffered_postgres and whose
    buffer queue exists (its URL came with the claim); anything else is a `PublishError`, which
    fails the attempt;
  * a message body is `{"dataset_uuid", "schema_hash", "records"}` and never exceeds
    `MAX_MESSAGE_BYTES` (256 KiB); a record that cannot fit alone is a `PublishError`; a
    SendMessageBatch call carries at most 10 messages and 256 KiB in all;
  * records are sent in the order written; full batches go out while the operator runs and the
    rest at `flush`, which the attempt awaits before it reports the task complete. A message SQS
    did not accept is retried (`SEND_ATTEMPTS` in all) before the attempt fails: publishing is
    at-least-once and the sink's (org_id, dedupe_key) makes it idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from taskplat.common.contracts.internal import OutputTarget

MAX_MESSAGE_BYTES = 256 * 1024
MAX_BATCH_ENTRIES = 10
SEND_ATTEMPTS = 3

# send(queue_url, bodies) -> the bodies SQS did not accept (with why), in order.
SendBatch = Callable[[str, list[str]], Awaitable[list[tuple[str, str]]]]


class PublishError(Exception):
    """Records could not be published; the attempt fails with this message."""


@dataclass
class _Buffer:
    queue_url: str
    head: str  # the body up to the records array: '{"dataset_uuid":...,"records":['
    bodies: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # serialized records of the open body
    pending_bytes: int = 0


class RecordPublisher:
    def __init__(self, outputs: Sequence[OutputTarget], send: SendBatch) -> None:
        self._outputs = {output.dataset_uuid: output for output in outputs}
        self._send = send
        self._buffers: dict[UUID, _Buffer] = {}
        self.published = 0

    def _buffer(self, dataset_uuid: UUID) -> _Buffer:
        buffer = self._buffers.get(dataset_uuid)
        if buffer is not None:
            return buffer
        output = self._outputs.get(dataset_uuid)
        if output is None or output.kind != "buffered_postgres":
            raise PublishError(
                f"dataset {dataset_uuid} is not a buffered_postgres output of the task's job"
            )
        if not output.buffer_queue_url or not output.schema_hash:
            raise PublishError(
                f"the buffer queue of dataset {dataset_uuid} is not created yet (the sink "
                "creates it); retry later"
            )
        head = (
            json.dumps(
                {"dataset_uuid": str(dataset_uuid), "schema_hash": output.schema_hash},
                separators=(",", ":"),
            )[:-1]
            + ',"records":['
        )
        buffer = _Buffer(output.buffer_queue_url, head)
        self._buffers[dataset_uuid] = buffer
        return buffer

    async def add(self, dataset_uuid: UUID, records: Sequence[object]) -> None:
        """Queue `records` for the dataset's buffer; send the full batches."""
        buffer = self._buffer(dataset_uuid)
        room = MAX_MESSAGE_BYTES - len(buffer.head.encode()) - 2  # "]}"
        for record in records:
            text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
            size = len(text.encode()) + 1  # the comma
            if size > room:
                raise PublishError(f"a record of {size} bytes does not fit in one SQS message")
            if buffer.pending_bytes + size > room:
                self._close_body(buffer)
            buffer.pending.append(text)
            buffer.pending_bytes += size
        await self._send_full(buffer)
        self.published += len(records)

    @staticmethod
    def _close_body(buffer: _Buffer) -> None:
        if buffer.pending:
            buffer.bodies.append(buffer.head + ",".join(buffer.pending) + "]}")
            buffer.pending, buffer.pending_bytes = [], 0

    async def _send_full(self, buffer: _Buffer) -> None:
        while len(buffer.bodies) >= MAX_BATCH_ENTRIES:
            await self._send_some(buffer)

    async def _send_some(self, buffer: _Buffer) -> None:
        """Send one batch from the head of the buffer (10 bodies, 256 KiB at most)."""
        batch: list[str] = []
        total = 0
        for body in buffer.bodies:
            size = len(body.encode())
            if batch and (len(batch) >= MAX_BATCH_ENTRIES or total + size > MAX_MESSAGE_BYTES):
                break
            batch.append(body)
            total += size
        del buffer.bodies[: len(batch)]
        remaining = batch
        for _ in range(SEND_ATTEMPTS):
            failed = await self._send(buffer.queue_url, remaining)
            if not failed:
                return
            remaining = [body for body, _ in failed]
            reason = failed[0][1]
        raise PublishError(f"SQS did not accept {len(remaining)} buffer messages: {reason}")

    async def flush(self) -> None:
        """Send everything queued; raises PublishError when some of it could not be sent."""
        for buffer in self._buffers.values():
            self._close_body(buffer)
            while buffer.bodies:
                await self._send_some(buffer)
