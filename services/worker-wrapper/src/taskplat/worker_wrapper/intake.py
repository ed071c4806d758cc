"""SQS intake: long-polls the task queue, deletes, extends and releases messages.

Invariants:
  * boto3 is blocking: every call runs on this intake's own thread pool, never on the event loop,
    and never competes with other work for the default executor.
  * A receive asks for at most 10 messages (the SQS maximum) and sets the visibility timeout
    explicitly, so the wrapper's extension schedule does not depend on the queue's default.
  * `delete`, `extend` and `release` never raise: a failure is logged and reported as False; an
    undeleted message only comes back later, and a claim then answers NotClaimed.
  * The queue URL is resolved on first use and cached; an error forgets it, so a queue created
    after the wrapper started is found.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from taskplat.common.logging import get_logger
from taskplat.common.sqs import QueueUrls

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

T = TypeVar("T")
SQS_MAX_BATCH = 10


@dataclass(frozen=True)
class Delivery:
    """One received SQS message."""

    message_id: str
    receipt_handle: str
    body: str
    receive_count: int


class SqsIntake:
    def __init__(
        self,
        client: SQSClient,
        queue_name: str,
        *,
        wait_time_seconds: int,
        visibility_timeout_seconds: int,
        threads: int = 8,
    ) -> None:
        self._client = client
        self.queue_name = queue_name
        self._urls = QueueUrls(client)
        self._wait = wait_time_seconds
        self._visibility = visibility_timeout_seconds
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sqs")

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _url(self) -> str:
        return self._urls.url(self.queue_name)

    async def receive(self, max_messages: int) -> list[Delivery]:
        """Long-poll for up to `max_messages` (capped at 10); raises on SQS errors."""
        count = max(1, min(max_messages, SQS_MAX_BATCH))

        def call() -> list[Delivery]:
            try:
                answer = self._client.receive_message(
                    QueueUrl=self._url(),
                    MaxNumberOfMessages=count,
                    WaitTimeSeconds=self._wait,
                    VisibilityTimeout=self._visibility,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                )
            except (BotoCoreError, ClientError):
                self._urls.forget(self.queue_name)
                raise
            return [_delivery(message) for message in answer.get("Messages", [])]

        return await self._call(call)

    async def delete(self, delivery: Delivery) -> bool:
        return await self._quietly(
            "sqs_delete_failed",
            delivery,
            lambda: self._client.delete_message(
                QueueUrl=self._url(), ReceiptHandle=delivery.receipt_handle
            ),
        )

    async def extend(self, delivery: Delivery) -> bool:
        """Renew the message's visibility timeout (it stays hidden while the task runs)."""
        return await self._set_visibility(delivery, self._visibility)

    async def release(self, delivery: Delivery) -> bool:
        """Make the message visible again at once (a wrapper that stops hands it back)."""
        return await self._set_visibility(delivery, 0)

    async def _set_visibility(self, delivery: Delivery, seconds: int) -> bool:
        return await self._quietly(
            "sqs_visibility_failed",
            delivery,
            lambda: self._client.change_message_visibility(
                QueueUrl=self._url(),
                ReceiptHandle=delivery.receipt_handle,
                VisibilityTimeout=seconds,
            ),
        )

    async def _quietly(self, event: str, delivery: Delivery, fn: Callable[[], Any]) -> bool:
        try:
            await self._call(fn)
        except (BotoCoreError, ClientError) as exc:
            get_logger().warning(event, message_id=delivery.message_id, error=str(exc))
            return False
        return True

    def close(self) -> None:
        """Stop the thread pool (a receive in flight finishes its long poll in the background)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _delivery(message: Any) -> Delivery:
    attributes = message.get("Attributes") or {}
    return Delivery(
        message_id=str(message.get("MessageId", "")),
        receipt_handle=str(message["ReceiptHandle"]),
        body=str(message.get("Body", "")),
        receive_count=int(attributes.get("ApproximateReceiveCount", "1")),
    )
