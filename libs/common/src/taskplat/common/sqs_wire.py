"""A lean SQS client for the calls made for every task: botocore's signer, urllib3's pool, no
more.

A boto3 call spends about 1 ms of CPU on generic machinery (parameter validation, endpoint rules,
event hooks, the user agent, the retry context) around one HTTP round trip: against LocalStack,
2.1-2.3 ms a call through boto3, 1.3-1.4 ms for the same request signed by botocore's `SigV4Auth`
and sent with urllib3 (docs/performance.md). `WireSqs` does that for the five hot operations and
is the wrapped boto3 client for everything else.

Invariants:
  * Only `send_message_batch`, `receive_message`, `delete_message`, `delete_message_batch` and
    `change_message_visibility` go over the wire here; every other attribute (queue URLs, queue
    creation, `meta`, `exceptions`) is the wrapped boto3 client's.
  * A request is what botocore sends for it: AWS JSON 1.0 (`X-Amz-Target: AmazonSQS.<Op>`,
    `x-amzn-query-mode: true`), the keyword arguments as the JSON body, signed with SigV4 by
    botocore with frozen credentials taken from the session's credentials on every call (so
    botocore refreshes expiring ones). An answer is the JSON body, the dict boto3 returns for it
    (binary attribute values stay base64 text; nothing here reads them). Parameters must be JSON
    values: no caller sends binary attributes.
  * Errors are botocore's: a service error raises the class boto3 raises (`ClientError` or its
    modelled subclass) with the same code (the query-compatible code of `x-amzn-query-error`
    when the server sends one); a transport failure raises `EndpointConnectionError`,
    `ConnectTimeoutError`, `ReadTimeoutError` or `HTTPClientError`.
  * Retries are botocore's standard mode, decided by its own `StandardRetryConditions`: up to
    `max_attempts` attempts in all for transport failures, transient and throttling answers (by
    code and status) and errors the model marks retryable, each after a full-jitter backoff (1 s
    base, 20 s cap); nothing else is retried. As with boto3, a retried send can deliver twice: a
    wake-up is at-least-once anyway.
  * Every call (once, whatever its retries) is reported to the `on_request` observers with
    botocore's snake_case operation name, as botocore's `before-call` hook is, so request
    counters see the same figures as with boto3.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
)
from botocore.httpsession import get_cert_path
from botocore.retries.standard import RetryContext, StandardRetryConditions

from taskplat.common.backoff import full_jitter_delay

HOT_OPERATIONS = {
    "send_message_batch": "SendMessageBatch",
    "receive_message": "ReceiveMessage",
    "delete_message": "DeleteMessage",
    "delete_message_batch": "DeleteMessageBatch",
    "change_message_visibility": "ChangeMessageVisibility",
}
RETRY_BASE_SECONDS = 1.0
RETRY_MAX_SECONDS = 20.0
SIGNED_HEADERS = {
    "Content-Type": "application/x-amz-json-1.0",
    "x-amzn-query-mode": "true",
}

RequestObserver = Callable[[str], None]


class WireSqs:
    """The five hot SQS operations over urllib3; the wrapped boto3 client for the rest."""

    def __init__(
        self,
        client: Any,
        credentials: Any,
        *,
        max_pool_connections: int,
        max_attempts: int,
        connect_timeout: float,
        read_timeout: float,
        rand: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._credentials = credentials
        self._region: str = client.meta.region_name
        self._url: str = client.meta.endpoint_url.rstrip("/") + "/"
        self._retryable = StandardRetryConditions(max_attempts=max(1, max_attempts))
        self._rand = rand or random.Random()
        self._sleep = sleep
        self._observers: list[RequestObserver] = []
        self._lock = threading.Lock()
        self._http = urllib3.PoolManager(
            num_pools=4,
            maxsize=max_pool_connections,
            block=False,
            retries=False,
            timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
            ca_certs=get_cert_path(True),
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the wrapped client's attributes.
        return getattr(self._client, name)

    def on_request(self, observer: RequestObserver) -> None:
        """Call `observer(op)` once for every call this client sends over the wire."""
        with self._lock:
            self._observers.append(observer)

    def send_message_batch(self, **params: Any) -> dict[str, Any]:
        return self._call("send_message_batch", params)

    def receive_message(self, **params: Any) -> dict[str, Any]:
        return self._call("receive_message", params)

    def delete_message(self, **params: Any) -> dict[str, Any]:
        return self._call("delete_message", params)

    def delete_message_batch(self, **params: Any) -> dict[str, Any]:
        return self._call("delete_message_batch", params)

    def change_message_visibility(self, **params: Any) -> dict[str, Any]:
        return self._call("change_message_visibility", params)

    def close(self) -> None:
        self._http.clear()
        self._client.close()

    def _call(self, op: str, params: dict[str, Any]) -> dict[str, Any]:
        operation = HOT_OPERATIONS[op]
        body = json.dumps(params).encode()
        for observer in self._observers:
            observer(op)
        attempt = 1
        while True:
            try:
                return self._attempt(operation, body)
            except ClientError as error:
                # botocore's rules read the error's code, its model and the answer's status.
                status = error.response["ResponseMetadata"]["HTTPStatusCode"]
                context = RetryContext(
                    attempt,
                    operation_model=self._client.meta.service_model.operation_model(operation),
                    parsed_response=error.response,
                    http_response=AWSResponse(self._url, status, HTTPHeaders(), None),
                )
                if not self._retryable.is_retryable(context):
                    raise
            except BotoCoreError as error:
                if not self._retryable.is_retryable(RetryContext(attempt, caught_exception=error)):
                    raise
            self._sleep(
                full_jitter_delay(RETRY_BASE_SECONDS, RETRY_MAX_SECONDS, attempt, self._rand)
            )
            attempt += 1

    def _attempt(self, operation: str, body: bytes) -> dict[str, Any]:
        request = AWSRequest(
            method="POST",
            url=self._url,
            data=body,
            headers={**SIGNED_HEADERS, "X-Amz-Target": f"AmazonSQS.{operation}"},
        )
        SigV4Auth(self._credentials.get_frozen_credentials(), "sqs", self._region).add_auth(request)
        try:
            response = self._http.request(
                "POST", self._url, body=body, headers=dict(request.headers.items())
            )
        except urllib3.exceptions.NewConnectionError as exc:  # a ConnectTimeoutError subclass
            raise EndpointConnectionError(endpoint_url=self._url, error=exc) from exc
        except urllib3.exceptions.ConnectTimeoutError as exc:
            raise ConnectTimeoutError(endpoint_url=self._url, error=exc) from exc
        except urllib3.exceptions.ReadTimeoutError as exc:
            raise ReadTimeoutError(endpoint_url=self._url, error=exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise HTTPClientError(error=exc) from exc
        if response.status == 200:
            answer: dict[str, Any] = json.loads(response.data) if response.data else {}
            return answer
        raise self._client_error(operation, response)

    def _client_error(self, operation: str, response: Any) -> ClientError:
        try:
            parsed = json.loads(response.data) if response.data else {}
        except ValueError:
            parsed = {}
        if not isinstance(parsed, dict):
            parsed = {}
        shape = str(parsed.get("__type") or response.headers.get("x-amzn-errortype") or "")
        shape = shape.rsplit("#", 1)[-1].split(":", 1)[0]
        code, _, kind = str(response.headers.get("x-amzn-query-error") or "").partition(";")
        message = str(parsed.get("message") or parsed.get("Message") or "")
        details: dict[str, Any] = {
            "Code": code or shape or str(response.status),
            "Message": message,
        }
        if code:
            details |= {"QueryErrorCode": shape, "Type": kind}
        error_response: Any = {
            "Error": details,
            "ResponseMetadata": {
                "HTTPStatusCode": response.status,
                "HTTPHeaders": dict(response.headers.items()),
            },
        }
        error_class = self._client.exceptions.from_code(shape or details["Code"])
        error: ClientError = error_class(error_response, operation)
        return error
