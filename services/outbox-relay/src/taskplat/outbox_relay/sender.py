"""Send outgoing messages with SendMessageBatch and report, per outbox row, whether SQS took it.

Invariants:
  * a message counts as sent only when SQS lists its entry id under `Successful`; an entry under
    `Failed`, an entry SQS did not mention, and every entry of a call that raised count as failed,
    each with a one-line reason;
  * `send()` never raises for an SQS or network problem: each chunk's failure stays with its own
    rows, so a missing queue or a broken call never blocks the rows of other queues;
  * a missing SQS queue forgets its cached URL, so a queue created later is found on the next try,
    and is named in the result's `missing`, so the relay can hold its task queue as one;
  * `probe()` tells whether an SQS queue exists (GetQueueUrl): True, False (SQS answered that it
    does not), or None when the call failed otherwise (nothing can be told).
  * calls of one batch run in parallel on a small thread pool (boto3 clients are thread-safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from taskplat.common.logging import get_logger
from taskplat.common.sqs import QueueUrls
from taskplat.outbox_relay.messages import OutgoingMessage, chunk_messages

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient
    from types_boto3_sqs.type_defs import SendMessageBatchRequestEntryTypeDef
else:
    SQSClient = Any

# Error codes of a missing queue: the query protocol's and the JSON protocol's spelling.
_MISSING_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})

# outbox_id -> None when SQS accepted the message, else the reason it did not.
SendOutcome = dict[int, str | None]


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: SendOutcome
    # SQS queue names that SQS answered do not exist.
    missing: frozenset[str] = frozenset()


def is_missing_queue(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code", "") in _MISSING_QUEUE_CODES


class Sender:
    def __init__(self, client: SQSClient, *, concurrency: int) -> None:
        self._client = client
        self._urls = QueueUrls(client)
        self._executor = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="relay-send"
        )
        self._log = get_logger()

    def send(self, messages: Sequence[OutgoingMessage]) -> SendResult:
        """Send every message; the outcome names each message's outbox id exactly once."""
        chunks = list(chunk_messages(messages))
        outcome: SendOutcome = {}
        missing: set[str] = set()
        results = (
            [self._send_chunk(chunks[0])]
            if len(chunks) == 1
            else self._executor.map(self._send_chunk, chunks)
        )
        for result, missing_name in results:
            outcome.update(result)
            if missing_name is not None:
                missing.add(missing_name)
        return SendResult(outcome, frozenset(missing))

    def probe(self, queue_name: str) -> bool | None:
        """Whether SQS queue `queue_name` exists (its URL is cached if so); None: unknown."""
        self._urls.forget(queue_name)
        try:
            self._urls.url(queue_name)
        except ClientError as exc:
            if is_missing_queue(exc):
                return False
            self._log.warning("relay_probe_failed", sqs_queue=queue_name, error=str(exc))
            return None
        except BotoCoreError as exc:
            self._log.warning("relay_probe_failed", sqs_queue=queue_name, error=str(exc))
            return None
        return True

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _send_chunk(self, chunk: list[OutgoingMessage]) -> tuple[SendOutcome, str | None]:
        queue_name = chunk[0].queue_name
        missing: str | None = None
        try:
            return self._send_batch(queue_name, chunk), None
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if is_missing_queue(exc):
                self._urls.forget(queue_name)
                reason = f"SQS queue {queue_name} does not exist"
                missing = queue_name
            else:
                message = exc.response.get("Error", {}).get("Message", "")
                reason = f"sending to SQS queue {queue_name} failed: {code}: {message}"
        except BotoCoreError as exc:
            reason = f"sending to SQS queue {queue_name} failed: {exc}"
        except Exception as exc:  # any other send error stays with this chunk's rows
            self._log.exception("relay_send_crashed", sqs_queue=queue_name)
            reason = f"sending to SQS queue {queue_name} failed: {type(exc).__name__}: {exc}"
        self._log.warning(
            "relay_send_failed", sqs_queue=queue_name, messages=len(chunk), error=reason
        )
        return {message.outbox_id: reason for message in chunk}, missing

    def _send_batch(self, queue_name: str, chunk: list[OutgoingMessage]) -> SendOutcome:
        url = self._urls.url(queue_name)
        entries: list[SendMessageBatchRequestEntryTypeDef] = []
        for message in chunk:
            entry: SendMessageBatchRequestEntryTypeDef = {
                "Id": str(message.outbox_id),
                "MessageBody": message.body,
            }
            if message.attributes:
                entry["MessageAttributes"] = message.attributes
            entries.append(entry)
        response = self._client.send_message_batch(QueueUrl=url, Entries=entries)
        accepted = {entry["Id"] for entry in response.get("Successful", [])}
        rejected = {
            entry["Id"]: f"SQS rejected the message: {entry['Code']}: {entry.get('Message', '')}"
            for entry in response.get("Failed", [])
        }
        outcome: SendOutcome = {}
        for message in chunk:
            entry_id = str(message.outbox_id)
            if entry_id in accepted:
                outcome[message.outbox_id] = None
            else:
                outcome[message.outbox_id] = rejected.get(
                    entry_id, "SQS did not report the message as sent"
                )
        if rejected:
            self._log.warning(
                "relay_messages_rejected",
                sqs_queue=queue_name,
                messages=len(rejected),
                error=next(iter(rejected.values())),
            )
        return outcome
