"""The credential broker's Starlette application factory and its one route.

Invariants:
  * `POST /credentials` answers STS credentials only for a valid capability token (Authorization:
    Bearer): signed by a known key, unexpired, a capability; anything else is 401 before STS is
    called. The credentials carry `policy.session_policy` of that capability and last
    `policy.session_seconds`.
  * A task asking more than `rate_limit_per_task` times per window gets 429 with `Retry-After`.
  * The body is read size-capped (413 once it passes `max_body_bytes`, never buffered whole
    first) and checked against the document limits (`taskplat.common.documents`, 422) before
    the contract parses it.
  * Bad input answers 4xx JSON (`{"error", "message", "detail"}`), STS trouble 502, never a 500
    with a traceback; tokens and credentials are never logged.
  * `/healthz`, `/readyz` and `/metrics` are open; every answer of `/credentials` is counted by
    outcome (`taskplat.broker.requests{outcome}`).
  * Every request is timed and, with tracing on, served in a SERVER span child of its
    `traceparent` (`taskplat.common.http_telemetry`, as the dispatcher's), so an operator's call
    joins its attempt's trace; the AssumeRole call is a CLIENT span `sts.assume_role` inside it,
    and both name the capability's task and attempt once the token is verified.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from taskplat.common.clock import Clock, SystemClock
from taskplat.common.contracts import CredentialsRequest, CredentialsResponse, ErrorResponse
from taskplat.common.documents import check_json, read_body
from taskplat.common.errors import (
    BadRequest,
    PayloadTooLarge,
    TaskplatError,
    Unauthorized,
    ValidationFailed,
)
from taskplat.common.http_telemetry import HttpTelemetryMiddleware
from taskplat.common.logging import get_logger
from taskplat.common.telemetry import PROMETHEUS_CONTENT_TYPE, Telemetry
from taskplat.common.tokens.capability import capability_key_ring, verify_capability_token
from taskplat.credential_broker.metric_specs import BROKER_REQUESTS
from taskplat.credential_broker.policy import packed, session_policy, session_seconds
from taskplat.credential_broker.ratelimit import RateLimiter
from taskplat.credential_broker.settings import BrokerSettings

STATUS_BY_ERROR: dict[type[TaskplatError], int] = {
    BadRequest: 400,
    Unauthorized: 401,
    PayloadTooLarge: 413,
    ValidationFailed: 422,
}


class StsUnavailable(TaskplatError):
    code = "sts_unavailable"


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = ErrorResponse(error=code, message=message, detail=None).model_dump_json()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a capability token is required as 'Authorization: Bearer <token>'")
    return token.strip()


async def _check_body(request: Request, settings: BrokerSettings) -> None:
    body = await read_body(request, settings.max_body_bytes)
    if body.strip():
        check_json(body, settings.document_limits())
        try:
            CredentialsRequest.model_validate_json(body)
        except ValueError as exc:
            raise ValidationFailed(f"the body must be empty or {{}}: {exc}") from None


class Broker:
    def __init__(
        self, settings: BrokerSettings, sts: Any, clock: Clock, telemetry: Telemetry
    ) -> None:
        self._settings = settings
        self._sts = sts
        self._clock = clock
        self._ring = capability_key_ring(settings.token_keys())
        self._limiter = RateLimiter(
            settings.rate_limit_per_task, settings.rate_limit_window_seconds
        )
        self._tracer = telemetry.tracer
        self._answers = telemetry.counter(BROKER_REQUESTS)

    async def credentials(self, request: Request) -> Response:
        try:
            return await self._credentials(request)
        except TaskplatError as exc:
            status = next(
                (STATUS_BY_ERROR[t] for t in type(exc).__mro__ if t in STATUS_BY_ERROR), 502
            )
            self._answers.add(1, {"outcome": exc.code})
            get_logger().info("credentials_refused", status=status, error=exc.code)
            return _error(status, exc.code, exc.message)

    async def _credentials(self, request: Request) -> Response:
        token = _bearer(request)
        now = self._clock.now()
        verified = verify_capability_token(self._ring, token, now=now)
        capability = verified.capability
        attributes: dict[str, AttributeValue] = {
            "taskplat.task_id": str(capability.task_id),
            "taskplat.attempt": capability.attempt,
        }
        trace.get_current_span().set_attributes(attributes)
        await _check_body(request, self._settings)
        wait = self._limiter.allow(capability.task_id, time.monotonic())
        if wait is not None:
            self._answers.add(1, {"outcome": "rate_limited"})
            seconds = max(1, int(wait + 0.999))
            return _error(
                429,
                "rate_limited",
                f"task {capability.task_id} asked too often; retry in {seconds} s",
                {"Retry-After": str(seconds)},
            )
        policy = session_policy(capability, verified.expires_at)
        duration = session_seconds(verified.expires_at, now, self._settings.max_session_seconds)
        with self._tracer.start_as_current_span(
            "sts.assume_role", kind=SpanKind.CLIENT, attributes=attributes
        ):
            try:
                answer = await asyncio.to_thread(
                    self._sts.assume_role,
                    RoleArn=self._settings.role_arn,
                    RoleSessionName=f"t-{capability.task_id.hex}-{capability.attempt}"[:64],
                    Policy=packed(policy),
                    DurationSeconds=duration,
                )
            except (BotoCoreError, ClientError) as exc:
                get_logger().warning("assume_role_failed", error=type(exc).__name__)
                raise StsUnavailable("STS refused or failed the AssumeRole call") from None
        credentials = answer["Credentials"]
        self._answers.add(1, {"outcome": "issued"})
        get_logger().info(
            "credentials_issued",
            task_id=str(capability.task_id),
            attempt=capability.attempt,
            kid=verified.kid,
            duration_seconds=duration,
        )
        response = CredentialsResponse(
            access_key_id=credentials["AccessKeyId"],
            secret_access_key=credentials["SecretAccessKey"],
            session_token=credentials["SessionToken"],
            expiration=credentials["Expiration"],
            usable_until=datetime.fromtimestamp(verified.expires_at, UTC),
            task_id=capability.task_id,
            attempt=capability.attempt,
            read_prefixes=capability.read_prefixes(),
            write_prefixes=capability.write_prefixes(),
            policy=json.loads(packed(policy)),
        )
        return Response(response.model_dump_json(), media_type="application/json")


def sts_client(settings: BrokerSettings) -> Any:
    """An STS client with the broker's own credentials (its task role on ECS)."""
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5)
    kwargs: dict[str, Any] = {"region_name": settings.aws_region, "config": config}
    if settings.sts_endpoint_url:
        kwargs["endpoint_url"] = settings.sts_endpoint_url
    return boto3.session.Session().client("sts", **kwargs)


def create_app(
    settings: BrokerSettings,
    *,
    sts: Any = None,
    clock: Clock | None = None,
    telemetry: Telemetry | None = None,
) -> Starlette:
    """The broker app; `sts` defaults to `sts_client(settings)`."""
    telemetry = telemetry or Telemetry("credential-broker", settings.telemetry_settings())
    broker = Broker(settings, sts or sts_client(settings), clock or SystemClock(), telemetry)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(telemetry.prometheus_text(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "not_found", "no such route")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, "method_not_allowed", "method not allowed")

    routes = [
        Route("/credentials", broker.credentials, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(HttpTelemetryMiddleware, telemetry=telemetry, routes=routes)],
        exception_handlers={404: not_found, 405: not_allowed},
    )
    app.state.settings = settings
    app.state.telemetry = telemetry
    return app
