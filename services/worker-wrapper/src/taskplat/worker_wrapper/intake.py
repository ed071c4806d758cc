"""SQS intake: long-polls the task queue, deletes, extends and releases messages.

Invariants:
  * boto3 is blocking: every call runs on this intake's own thread pool, never on the event loop,
    and never competes with other work for the default executor.
  * A receive asks for at most 10 messages (the SQS maximum) and sets the visibility timeout
    explicitly, so the wrapper's extension schedule does not depend on the queue's default. It
    sets the short `receive_visibility_seconds`: a long poll left open by a wrapper that died
    (SQS still answers it, to nobody) hides the wake-up it takes for that long only, not for the
    full visibility timeout. A message this wrapper still handles when half of that has passed
    since the receive (a slow claim, a running task) is renewed once to the full
    `visibility_timeout_seconds`; one whose deletion has started, or released, costs no request
    (and no renewal can race its deletion: a failed deletion lets the message come back after the
    short timeout, to be answered NotClaimed). `extend` renews a message to the full timeout.
  * `delete`, `extend` and `release` never raise: a failure is logged and reported as False; an
    undeleted message only comes back later, and a claim then answers NotClaimed.
  * With batching on, deletions are batched by turn (`turn_batching`): those asked for in one
    event-loop turn go together (the stale wake-ups of one claim batch, the messages of one
    completion batch), one DeleteMessageBatch per 10, a lone one as DeleteMessage, at most
    `parallel_deletes` requests in flight. Each message's outcome is its own entry's. With
    `delete_linger_seconds`, a deletion waits that long for others (10 go at once), so under load
    batches fill; nobody waits on it for speed: a completed task's message is deleted in the
    background (`delete_soon`), its slot already free.
  * The queue URL is resolved on first use and cached; an error forgets it, so a queue created
    after the wrapper started is found.
  * A receive asks for every message attribute: the W3C trace context (`traceparent`,
    `tracestate` String attributes) travels there; nothing else of them is used.
  * Every SQS request (by op), every message received, every message deleted (with why) and
    every failed SQS call is counted;
    each deletion is logged as `message_deleted` with its why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from taskplat.common.logging import get_logger
from taskplat.common.sqs import QueueUrls
from taskplat.worker_wrapper.observability import DeleteWhy, SqsOp, WrapperTelemetry
from taskplat.worker_wrapper.turn_batching import TurnBatcher

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient
    from types_boto3_sqs.type_defs import DeleteMessageBatchRequestEntryTypeDef

T = TypeVar("T")
SQS_MAX_BATCH = 10
TRACE_ATTRIBUTES = ("traceparent", "tracestate")


@dataclass(frozen=True)
class Delivery:
    """One received SQS message."""

    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    trace_context: Mapping[str, str] = field(default_factory=dict)
    received_at: float = 0.0  # time.monotonic() when the receive returned


class SqsIntake:
    def __init__(
        self,
        client: SQSClient,
        queue_name: str,
        *,
        wait_time_seconds: int,
        visibility_timeout_seconds: int,
        threads: int = 8,
        telemetry: WrapperTelemetry | None = None,
        batch_deletes: bool = False,
        parallel_deletes: int = 4,
        receive_visibility_seconds: int | None = None,
        delete_linger_seconds: float = 0.0,
    ) -> None:
        self._client = client
        self.queue_name = queue_name
        self._urls = QueueUrls(client)
        self._wait = wait_time_seconds
        self.visibility_timeout = visibility_timeout_seconds
        self.receive_visibility = min(
            receive_visibility_seconds or visibility_timeout_seconds, visibility_timeout_seconds
        )
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sqs")
        self._telemetry = telemetry or WrapperTelemetry()
        self._deletes: TurnBatcher[Delivery, bool] | None = (
            TurnBatcher(
                self._send_deletes,
                max_batch=SQS_MAX_BATCH,
                parallel=parallel_deletes,
                linger_seconds=delete_linger_seconds,
            )
            if batch_deletes
            else None
        )
        self._background: set[asyncio.Future[bool]] = set()
        self._background_any: set[asyncio.Future[bool]] = set()
        # Receipt handle -> the pending early renewal of a message received with the short timeout.
        self._early: dict[str, asyncio.TimerHandle] = {}

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _url(self) -> str:
        return self._urls.url(self.queue_name)

    async def receive(self, max_messages: int) -> list[Delivery]:
        """Long-poll for up to `max_messages` (capped at 10); raises on SQS errors."""
        count = max(1, min(max_messages, SQS_MAX_BATCH))

        def call() -> list[Delivery]:
            self._telemetry.sqs_request("receive")
            try:
                answer = self._client.receive_message(
                    QueueUrl=self._url(),
                    MaxNumberOfMessages=count,
                    WaitTimeSeconds=self._wait,
                    VisibilityTimeout=self.receive_visibility,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                    MessageAttributeNames=["All"],
                )
            except (BotoCoreError, ClientError):
                self._urls.forget(self.queue_name)
                raise
            now = time.monotonic()
            return [_delivery(message, now) for message in answer.get("Messages", [])]

        try:
            deliveries = await self._call(call)
        except Exception:
            self._telemetry.sqs_error("receive")
            raise
        self._telemetry.received(len(deliveries))
        if self.receive_visibility < self.visibility_timeout:
            loop = asyncio.get_running_loop()
            for delivery in deliveries:
                delay = delivery.received_at + self.receive_visibility / 2 - time.monotonic()
                self._early[delivery.receipt_handle] = loop.call_later(
                    max(0.0, delay), self._renew_early, delivery
                )
        return deliveries

    def _renew_early(self, delivery: Delivery) -> None:
        if self._early.pop(delivery.receipt_handle, None) is not None:
            task = asyncio.ensure_future(self.extend(delivery))
            self._background_any.add(task)
            task.add_done_callback(self._background_any.discard)

    def _handled(self, delivery: Delivery) -> None:
        """The message is deleted or handed back: no early renewal for it."""
        pending = self._early.pop(delivery.receipt_handle, None)
        if pending is not None:
            pending.cancel()

    async def delete(self, delivery: Delivery, why: DeleteWhy, **fields: object) -> bool:
        """Delete the message; log `message_deleted` (with `fields`) and count it by `why`."""
        self._handled(delivery)  # no early renewal racing the deletion
        if self._deletes is not None:  # sent at the end of this turn, with the turn's others
            deleted = await self._deletes.submit(delivery)
        else:
            deleted = await self._delete_one(delivery)
        if deleted:
            self._telemetry.deleted(why)
            get_logger().info("message_deleted", why=why, message_id=delivery.message_id, **fields)
        return deleted

    def delete_soon(self, delivery: Delivery, why: DeleteWhy, **fields: object) -> None:
        """`delete` in the background: the caller (a finished task's slot) does not wait for it.
        `settle` waits for those still running."""
        task = asyncio.ensure_future(self.delete(delivery, why, **fields))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def hide_soon(self, delivery: Delivery, seconds: int) -> None:
        """Keep the message (never deleted) hidden `seconds` more, in the background: it comes
        back then, for a task a limit held back (its slot is free at once)."""
        self._handled(delivery)  # no early renewal racing it
        get_logger().info("message_hidden", message_id=delivery.message_id, seconds=seconds)
        task = asyncio.ensure_future(self._set_visibility(delivery, seconds))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the background deletions (a stop); an undeleted
        message only comes back after its visibility timeout and is answered NotClaimed."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)

    async def _delete_one(self, delivery: Delivery) -> bool:
        self._telemetry.sqs_request("delete")
        return await self._quietly(
            "sqs_delete_failed",
            "delete",
            delivery,
            lambda: self._client.delete_message(
                QueueUrl=self._url(), ReceiptHandle=delivery.receipt_handle
            ),
        )

    async def _send_deletes(self, batch: list[Delivery]) -> list[bool]:
        try:
            if len(batch) == 1:
                return [await self._delete_one(batch[0])]
            return await self._delete_batch(batch)
        except Exception as exc:  # the calls do not raise; should one, nothing is deleted
            get_logger().warning("sqs_delete_failed", error=str(exc), count=len(batch))
            return [False] * len(batch)

    async def _delete_batch(self, deliveries: list[Delivery]) -> list[bool]:
        """One DeleteMessageBatch; whether each message was deleted (failures logged, counted)."""
        entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
            {"Id": str(index), "ReceiptHandle": delivery.receipt_handle}
            for index, delivery in enumerate(deliveries)
        ]
        self._telemetry.sqs_request("delete_batch")
        try:
            answer = await self._call(
                lambda: self._client.delete_message_batch(
                    QueueUrl=self._url(),
                    Entries=entries,
                )
            )
        except (BotoCoreError, ClientError) as exc:
            for delivery in deliveries:
                self._telemetry.sqs_error("delete")
                get_logger().warning(
                    "sqs_delete_failed", message_id=delivery.message_id, error=str(exc)
                )
            return [False] * len(deliveries)
        deleted = {entry["Id"] for entry in answer.get("Successful", [])}
        failures = {entry["Id"]: entry for entry in answer.get("Failed", [])}
        for index, delivery in enumerate(deliveries):
            if str(index) not in deleted:
                self._telemetry.sqs_error("delete")
                failure = failures.get(str(index))
                error = (failure.get("Message") or failure["Code"]) if failure else "not deleted"
                get_logger().warning(
                    "sqs_delete_failed", message_id=delivery.message_id, error=str(error)
                )
        return [str(index) in deleted for index in range(len(deliveries))]

    async def extend(self, delivery: Delivery) -> bool:
        """Renew the message's visibility timeout (it stays hidden while the task runs)."""
        return await self._set_visibility(delivery, self.visibility_timeout)

    async def release(self, delivery: Delivery) -> bool:
        """Make the message visible again at once (a wrapper that stops hands it back)."""
        self._handled(delivery)
        return await self._set_visibility(delivery, 0)

    async def _set_visibility(self, delivery: Delivery, seconds: int) -> bool:
        self._telemetry.sqs_request("change_visibility")
        return await self._quietly(
            "sqs_visibility_failed",
            "change_visibility",
            delivery,
            lambda: self._client.change_message_visibility(
                QueueUrl=self._url(),
                ReceiptHandle=delivery.receipt_handle,
                VisibilityTimeout=seconds,
            ),
        )

    async def _quietly(
        self, event: str, op: SqsOp, delivery: Delivery, fn: Callable[[], Any]
    ) -> bool:
        try:
            await self._call(fn)
        except (BotoCoreError, ClientError) as exc:
            self._telemetry.sqs_error(op)
            get_logger().warning(event, message_id=delivery.message_id, error=str(exc))
            return False
        return True

    async def send_bodies(self, queue_url: str, bodies: list[str]) -> list[tuple[str, str]]:
        """One SendMessageBatch of `bodies` to `queue_url` (a dataset's buffer); the bodies SQS
        did not accept, each with why (all of them when the call failed)."""

        def call() -> list[tuple[str, str]]:
            self._telemetry.sqs_request("send_batch")
            answer = self._client.send_message_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(i), "MessageBody": body} for i, body in enumerate(bodies)],
            )
            return [
                (bodies[int(item["Id"])], str(item.get("Message") or item.get("Code")))
                for item in answer.get("Failed", [])
            ]

        try:
            return await self._call(call)
        except (BotoCoreError, ClientError) as exc:
            self._telemetry.sqs_error("send_batch")
            return [(body, str(exc)) for body in bodies]

    def close(self) -> None:
        """Stop the thread pool (a receive in flight finishes its long poll in the background)."""
        for pending in self._early.values():
            pending.cancel()
        self._early.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _delivery(message: Any, received_at: float) -> Delivery:
    attributes = message.get("Attributes") or {}
    return Delivery(
        received_at=received_at,
        message_id=str(message.get("MessageId", "")),
        receipt_handle=str(message["ReceiptHandle"]),
        body=str(message.get("Body", "")),
        receive_count=int(attributes.get("ApproximateReceiveCount", "1")),
        trace_context=_trace_context(message.get("MessageAttributes") or {}),
    )


def _trace_context(attributes: Mapping[str, Any]) -> dict[str, str]:
    """The `traceparent`/`tracestate` String attributes of a message (others ignored)."""
    carrier: dict[str, str] = {}
    for name in TRACE_ATTRIBUTES:
        value = attributes.get(name)
        if isinstance(value, Mapping) and isinstance(value.get("StringValue"), str):
            carrier[name] = value["StringValue"]
    return carrier
