"""The Lambda side of the invoker: the client, the function a task invokes, the invocation's
payload, and one asynchronous invocation (`InvocationType=Event`).

Invariants:
  * the client retries nothing (`total_max_attempts=1`): a failed Invoke is retried by the
    invoker only, with backoff and a new claim; Lambda's own retries are off in the deploy
    template (`EventInvokeConfig.MaximumRetryAttempts: 0`);
  * an invocation counts as accepted only on 202; anything else (an error, a refusal, another
    status, no answer within `lambda_invoke_timeout_seconds`) raises `InvokeFailed`, so the
    claim made for it is rolled back;
  * the payload is the claim as `task-claim` answers it (`claimed_response`, shared with the
    dispatcher) plus the attempt token and, for an untrusted job, its capability token: tokens
    travel in the payload, never in the function's environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from taskplat.common.claim_answer import claimed_response
from taskplat.outbox_relay.settings import RelaySettings

if TYPE_CHECKING:
    from types_boto3_lambda.client import LambdaClient
else:
    LambdaClient = Any

LOCAL_HOSTS = ("://127.0.0.1", "://localhost", "://[::1]")


class InvokeFailed(Exception):
    """Lambda did not accept the invocation; the claim made for it is rolled back."""


def function_name(settings: RelaySettings, operator: str) -> str:
    """The function a `runtime: lambda` task of `operator` invokes."""
    return f"{settings.lambda_function_prefix}{operator}"


def invocation_payload(
    row: dict[str, Any], attempt_token: str, capability_token: str | None = None
) -> bytes:
    """The event the function receives: the claim as `task-claim` answers it (the `task-fetch`
    task, the attempt, its lease token and expiry) plus the attempt token, and for an untrusted
    job its capability token."""
    answer = claimed_response(row, attempt_token=attempt_token, capability_token=capability_token)
    return answer.model_dump_json().encode()


def lambda_client(settings: RelaySettings, *, max_pool_connections: int = 10) -> LambdaClient:
    """A boto3 Lambda client that retries nothing (the invoker does, with a new claim)."""
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        connect_timeout=min(5.0, settings.lambda_invoke_timeout_seconds),
        read_timeout=settings.lambda_invoke_timeout_seconds,
    )
    kwargs: dict[str, Any] = {"region_name": settings.aws_region, "config": config}
    if settings.lambda_endpoint_url:
        kwargs["endpoint_url"] = settings.lambda_endpoint_url
        if any(local in settings.lambda_endpoint_url for local in LOCAL_HOSTS):
            # A local endpoint (LocalStack, the tests' LocalLambda) takes any credentials.
            kwargs["aws_access_key_id"] = "test"
            kwargs["aws_secret_access_key"] = "test"
    client: LambdaClient = boto3.session.Session().client("lambda", **kwargs)
    return client


def invoke_async(client: LambdaClient, name: str, payload: bytes) -> None:
    """Invoke function `name` asynchronously with `payload`; `InvokeFailed` unless accepted."""
    try:
        answer = client.invoke(FunctionName=name, InvocationType="Event", Payload=payload)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise InvokeFailed(
            f"invoke {name}: {error.get('Code', 'ClientError')}: {error.get('Message', exc)}"
        ) from exc
    except BotoCoreError as exc:
        raise InvokeFailed(f"invoke {name}: {type(exc).__name__}: {exc}") from exc
    status = answer.get("StatusCode")
    if status != 202:
        raise InvokeFailed(f"invoke {name}: Lambda answered {status}, not 202 (accepted)")
