"""The query service's Starlette application factory and its one route.

Invariants:
  * `POST /query` runs SQL only for a valid capability token (Authorization: Bearer): signed by a
    known key, unexpired, a capability; anything else is 401 before the body is read. A token's
    signature is checked once per process (`verified.py`), its expiry on every query.
  * Order of checks: token (401), body (413/422), admission per token (429), the token's inputs,
    the statement guard (400/403, decided inside the query's sandbox: DuckDB's parser never sees
    untrusted SQL in this process), then the inputs the statement reads are read and handed over
    and the query runs. A refused statement reads nothing and is given no input.
  * This process reads only the inputs the statement reads (`guard.Checked.views`) and hands them
    to a sandbox process of its own (`pool.py`) as Arrow; the sandbox holds no secret, database
    connection or AWS credential, and serves this one query.
  * Past the time limit the query's sandbox is killed and the query answers 408; its
    slot is freed once its thread has returned.
  * Bad input answers 4xx JSON (`{"error", "message", "detail"}`), storage or STS trouble 502,
    never a 500 with a traceback; tokens, credentials and SQL text are never logged.
  * `/healthz`, `/readyz`, `/metrics` and `/openapi.json` are open; every answer of `/query` is
    counted by outcome (`taskplat.query.requests{outcome}`) and its duration recorded.
  * Every request is timed and, with tracing on, served in a SERVER span child of its
    `traceparent` (`taskplat.common.http_telemetry`, as the dispatcher's), so an operator's query
    joins its attempt's trace; an admitted query runs inside an INTERNAL span `query.execute`;
    both name the capability's task and attempt once the token is verified (never the SQL).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import boto3
import psycopg
import pyarrow as pa
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from taskplat.common.clock import Clock, SystemClock
from taskplat.common.contracts.base import Contract
from taskplat.common.errors import (
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    TaskplatError,
    Unauthorized,
    ValidationFailed,
)
from taskplat.common.http_telemetry import HttpTelemetryMiddleware
from taskplat.common.logging import get_logger
from taskplat.common.telemetry import PROMETHEUS_CONTENT_TYPE, Telemetry
from taskplat.common.tokens.capability import VerifiedCapability, capability_key_ring
from taskplat.query_service import engine
from taskplat.query_service.contracts import QueryRequest, openapi
from taskplat.query_service.engine import QueryTimeout
from taskplat.query_service.inputs import InputView, lookup, view_names
from taskplat.query_service.limits import Admission, TokenKey
from taskplat.query_service.metric_specs import QUERY_DURATION, QUERY_ENGINES_OPENED, QUERY_REQUESTS
from taskplat.query_service.pool import SandboxPool
from taskplat.query_service.s3access import CredentialSource, S3Credentials
from taskplat.query_service.settings import QuerySettings
from taskplat.query_service.tables import InputUnreadable, S3Reader, postgres_table
from taskplat.query_service.verified import VerifiedTokens

STATUS_BY_ERROR: dict[type[TaskplatError], int] = {
    BadRequest: 400,
    Unauthorized: 401,
    Forbidden: 403,
    QueryTimeout: 408,
    PayloadTooLarge: 413,
    ValidationFailed: 422,
}


class Unavailable(TaskplatError):
    code = "unavailable"


class ErrorBody(Contract):
    error: str
    message: str
    detail: Any = None


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = ErrorBody(error=code, message=message).model_dump_json()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a capability token is required as 'Authorization: Bearer <token>'")
    return token.strip()


async def _body(request: Request, cap: int) -> QueryRequest:
    body = await request.body()
    if len(body) > cap:
        raise PayloadTooLarge(f"request body over {cap} bytes")
    try:
        return QueryRequest.model_validate_json(body)
    except ValueError as exc:
        raise ValidationFailed(f"the body is not a valid query request: {exc}") from None


class QueryService:
    def __init__(
        self,
        settings: QuerySettings,
        pool: ConnectionPool[Any],
        credentials: CredentialSource,
        clock: Clock,
        telemetry: Telemetry,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._credentials = credentials
        self._clock = clock
        self._tokens = VerifiedTokens(capability_key_ring(settings.token_keys()))
        self._admission = Admission(
            settings.rate_limit_per_token,
            settings.rate_limit_window_seconds,
            settings.concurrent_per_token,
        )
        self._executor = ThreadPoolExecutor(
            max_workers=settings.workers, thread_name_prefix="query"
        )
        self._s3_reader = S3Reader(settings.s3_endpoint_url, settings.aws_region)
        self._limits = engine.Limits(
            max_rows=settings.max_rows,
            max_bytes=settings.max_bytes,
            timeout_seconds=settings.timeout_seconds,
            memory_limit=settings.memory_limit,
            threads=settings.threads,
        )
        self.sandboxes = SandboxPool(settings.sandboxes, self._limits)
        self._tracer = telemetry.tracer
        self._answers = telemetry.counter(QUERY_REQUESTS)
        self._engines = telemetry.counter(QUERY_ENGINES_OPENED)
        self._duration = telemetry.histogram(QUERY_DURATION)

    def start(self) -> None:
        self.sandboxes.start()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.sandboxes.close()

    async def query(self, request: Request) -> Response:
        try:
            return await self._query(request)
        except TaskplatError as exc:
            status = next(
                (STATUS_BY_ERROR[t] for t in type(exc).__mro__ if t in STATUS_BY_ERROR), 502
            )
            self._answers.add(1, {"outcome": exc.code})
            get_logger().info("query_refused", status=status, error=exc.code)
            return _error(status, exc.code, exc.message)

    async def _query(self, request: Request) -> Response:
        verified = self._tokens.verify(_bearer(request), now=self._clock.now())
        body = await _body(request, self._settings.max_body_bytes)
        key: TokenKey = (verified.capability.task_id, verified.capability.attempt)
        attributes: dict[str, AttributeValue] = {
            "taskplat.task_id": str(key[0]),
            "taskplat.attempt": key[1],
        }
        trace.get_current_span().set_attributes(attributes)
        refused = self._admission.admit(key, time.monotonic())
        if refused is not None:
            reason, wait = refused
            self._answers.add(1, {"outcome": reason})
            seconds = max(1, int(wait + 0.999))
            what = (
                "has too many queries running"
                if reason == "too_many_running"
                else ("asked too often")
            )
            return _error(
                429,
                reason,
                f"the token of task {key[0]} attempt {key[1]} {what}; retry in {seconds} s",
                {"Retry-After": str(seconds)},
            )
        started = time.monotonic()
        with self._tracer.start_as_current_span("query.execute", attributes=attributes) as span:
            try:
                loop = asyncio.get_running_loop()
                answer = await loop.run_in_executor(self._executor, self._run, verified, body)
            finally:
                self._admission.release(key)
                self._duration.record(time.monotonic() - started)
            span.set_attribute("taskplat.query.rows", answer.row_count)
            span.set_attribute("taskplat.query.truncated", answer.truncated)
        self._answers.add(1, {"outcome": "answered"})
        get_logger().info(
            "query_answered",
            task_id=str(key[0]),
            attempt=key[1],
            rows=answer.row_count,
            truncated=answer.truncated,
            elapsed_ms=answer.elapsed_ms,
        )
        headers = {
            "X-Taskplat-Row-Count": str(answer.row_count),
            "X-Taskplat-Truncated": "true" if answer.truncated else "false",
            "X-Taskplat-Elapsed-Ms": str(answer.elapsed_ms),
        }
        return Response(answer.body, media_type=answer.media_type, headers=headers)

    def _run(self, verified: VerifiedCapability, body: QueryRequest) -> engine.Answer:
        """In a worker thread: the token's inputs, a sandbox, its guard's decision, the inputs
        the statement reads read and handed over, the answer."""
        try:
            views = view_names(lookup(self._pool, verified.capability))
        except (psycopg.Error, TimeoutError) as exc:
            get_logger().warning("catalog_failed", error=type(exc).__name__)
            raise Unavailable("the platform database could not be read") from None
        sandbox = self.sandboxes.take()
        try:
            read = sandbox.check(body.sql, views, self._limits)
        except BaseException:
            sandbox.close()
            raise
        used = {name: views[name] for name in read}
        inputs = list({id(v): v for v in used.values()}.values())
        try:
            credentials = self._s3(verified, inputs)
            tables = [self._table(view, credentials) for view in inputs]
        except BaseException:
            sandbox.close()
            raise
        position = {id(v): index for index, v in enumerate(inputs)}
        max_rows = min(
            body.max_rows if body.max_rows is not None else self._settings.max_rows,
            self._settings.max_rows,
        )
        request = {
            "params": body.params,
            "max_rows": max_rows,
            "format": body.format,
            "views": [[name, position[id(view)]] for name, view in used.items()],
        }
        self._engines.add(1)
        return sandbox.run(request, tables, self._limits)

    def _table(self, view: InputView, credentials: S3Credentials | None) -> pa.Table:
        cap = self._settings.max_input_bytes
        if view.table_name:
            try:
                return postgres_table(self._pool, view, cap)
            except (psycopg.Error, TimeoutError) as exc:
                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                raise InputUnreadable(
                    f"input {view.name} ({view.dataset_uuid}) cannot be read: "
                    f"{first or type(exc).__name__}"
                ) from None
        assert credentials is not None
        try:
            return self._s3_reader.table(view, credentials, cap)
        except (BotoCoreError, ClientError) as exc:
            get_logger().warning("s3_read_failed", error=type(exc).__name__)
            raise InputUnreadable(
                f"input {view.name} ({view.dataset_uuid}) cannot be read from S3"
            ) from None
        except (OSError, ValueError) as exc:  # pyarrow: not Parquet, or unlike schemas
            raise InputUnreadable(
                f"input {view.name} ({view.dataset_uuid}) cannot be read: {type(exc).__name__}"
            ) from None

    def _s3(self, verified: VerifiedCapability, used: list[InputView]) -> S3Credentials | None:
        prefixes = sorted({v.s3_prefix for v in used if v.s3_prefix})
        if not prefixes:
            return None
        try:
            return self._credentials.for_capability(
                verified.capability, prefixes, verified.expires_at, self._clock.now()
            )
        except (BotoCoreError, ClientError) as exc:
            get_logger().warning("assume_role_failed", error=type(exc).__name__)
            raise InputUnreadable("STS refused or failed the AssumeRole call") from None


def sts_client(settings: QuerySettings) -> Any:
    """An STS client with the service's own credentials (its task role on ECS)."""
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5)
    kwargs: dict[str, Any] = {"region_name": settings.aws_region, "config": config}
    if settings.sts_endpoint_url:
        kwargs["endpoint_url"] = settings.sts_endpoint_url
    return boto3.session.Session().client("sts", **kwargs)


def catalog_pool(settings: QuerySettings) -> ConnectionPool[Any]:
    return ConnectionPool(
        settings.database_url.get_secret_value(),
        kwargs={
            "autocommit": True,
            "application_name": "taskplat-query-catalog",
            "connect_timeout": settings.connect_timeout_seconds,
        },
        min_size=1,
        max_size=max(4, settings.workers),
        timeout=settings.connect_timeout_seconds,
        open=False,
        name="query-catalog",
    )


def create_app(
    settings: QuerySettings,
    *,
    sts: Any = None,
    pool: ConnectionPool[Any] | None = None,
    clock: Clock | None = None,
    telemetry: Telemetry | None = None,
) -> Starlette:
    """The query service app; `sts` defaults to `sts_client(settings)`, `pool` to a pool of the
    read-only database URL (opened here, closed on shutdown)."""
    telemetry = telemetry or Telemetry("query-service", settings.telemetry_settings())
    owned = pool is None
    pool = pool or catalog_pool(settings)
    if owned:
        pool.open(wait=False)
    credentials = CredentialSource(sts or sts_client(settings), settings.role_arn)
    service = QueryService(settings, pool, credentials, clock or SystemClock(), telemetry)
    document = openapi()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(telemetry.prometheus_text(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "not_found", "no such route")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, "method_not_allowed", "method not allowed")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            service.close()
            if owned:
                pool.close()

    routes = [
        Route("/query", service.query, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(HttpTelemetryMiddleware, telemetry=telemetry, routes=routes)],
        exception_handlers={404: not_found, 405: not_allowed},
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.telemetry = telemetry
    app.state.service = service
    return app
