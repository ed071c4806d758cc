"""SQS helpers shared by the relay, the scheduler and the worker wrapper (needs the `sqs` extra).

Invariants: one SQS queue per task queue, named `sqs_queue_prefix + queue`; a wake-up body is
exactly `{"task_id": "<uuid>"}`; queue URLs are resolved once per process and cached. Local
endpoints get dummy credentials so nothing reads a developer's ~/.aws. With `sqs_wire_client` on
(the default) the client's hot calls go through `sqs_wire.WireSqs` (the same requests and answers
at about 60% of the CPU), unless a proxy is configured in the environment, which only botocore
honours.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import TYPE_CHECKING, Any
from uuid import UUID

import boto3
from botocore.config import Config
from botocore.credentials import Credentials

from taskplat.common.settings import SqsSettings
from taskplat.common.sqs_wire import WireSqs

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient
    from types_boto3_sqs.literals import QueueAttributeNameType as QueueAttributeName
else:
    SQSClient = Any
    QueueAttributeName = str


def sqs_client(
    settings: SqsSettings,
    *,
    max_pool_connections: int = 20,
    max_attempts: int = 5,
    connect_timeout: float = 5,
    read_timeout: float = 30,
    session: boto3.session.Session | None = None,
) -> SQSClient:
    """A boto3 SQS client for the configured endpoint, with retries for throttling and 5xx.

    `read_timeout` must exceed the long-poll wait of a receiving client. `session` (default: a
    new one) supplies the credentials, e.g. ones held in memory rather than read from the
    environment.
    """
    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    kwargs: dict[str, Any] = {"region_name": settings.aws_region, "config": config}
    session = session or boto3.session.Session()
    credentials = None
    if settings.sqs_endpoint_url:
        kwargs["endpoint_url"] = settings.sqs_endpoint_url
        if _is_local(settings.sqs_endpoint_url):
            kwargs["aws_access_key_id"] = "test"
            kwargs["aws_secret_access_key"] = "test"
            credentials = Credentials("test", "test")
    client: SQSClient = session.client("sqs", **kwargs)
    credentials = credentials or session.get_credentials()
    if not settings.sqs_wire_client or credentials is None or _proxied():
        return client
    wire: Any = WireSqs(
        client,
        credentials,
        max_pool_connections=max_pool_connections,
        max_attempts=max_attempts,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    wired: SQSClient = wire
    return wired


def _proxied() -> bool:
    proxies = urllib.request.getproxies()
    return "http" in proxies or "https" in proxies


def _is_local(endpoint_url: str) -> bool:
    return any(host in endpoint_url for host in ("://127.0.0.1", "://localhost", "://[::1]"))


def sqs_queue_name(settings: SqsSettings, queue: str) -> str:
    return f"{settings.sqs_queue_prefix}{queue}"


def wake_up_body(task_id: UUID | str) -> str:
    return json.dumps({"task_id": str(task_id)})


class QueueUrls:
    """Resolves and caches SQS queue URLs by name (thread-safe)."""

    def __init__(self, client: SQSClient) -> None:
        self._client = client
        self._urls: dict[str, str] = {}
        self._lock = threading.Lock()

    def url(self, queue_name: str) -> str:
        with self._lock:
            cached = self._urls.get(queue_name)
        if cached is not None:
            return cached
        resolved = self._client.get_queue_url(QueueName=queue_name)["QueueUrl"]
        with self._lock:
            self._urls[queue_name] = resolved
        return resolved

    def forget(self, queue_name: str) -> None:
        with self._lock:
            self._urls.pop(queue_name, None)


def ensure_queue(
    client: SQSClient,
    queue_name: str,
    *,
    dead_letter_queue_name: str | None = None,
    max_receive_count: int = 10,
    visibility_timeout_seconds: int = 60,
) -> str:
    """Create `queue_name` (and its poison-message DLQ with a redrive policy); return its URL.

    Used by the local stack and tests; in AWS the queues come from the CloudFormation templates.
    """
    attributes: dict[QueueAttributeName, str] = {
        "VisibilityTimeout": str(visibility_timeout_seconds)
    }
    if dead_letter_queue_name is not None:
        dlq_url = client.create_queue(QueueName=dead_letter_queue_name)["QueueUrl"]
        dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        attributes["RedrivePolicy"] = json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}
        )
    return client.create_queue(QueueName=queue_name, Attributes=attributes)["QueueUrl"]
