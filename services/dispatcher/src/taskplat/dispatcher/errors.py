"""The one table from domain errors to HTTP responses.

Invariants: every error body is JSON `{"error", "message", "detail"}` (a worker-call rejection is
`{"status": "Rejected", "reason", "message"}` as the internal contract says); no response carries a
traceback; a database outage answers 503, a value Postgres refuses as data (class 22) 422, an
unexpected bug 500 with a log line.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from taskplat.common.contracts import ErrorResponse, RejectedResponse
from taskplat.common.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    Rejected,
    TaskplatError,
    Unauthorized,
    ValidationFailed,
)
from taskplat.common.logging import get_logger

STATUS_BY_ERROR: dict[type[TaskplatError], int] = {
    BadRequest: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Rejected: 409,
    PayloadTooLarge: 413,
    ValidationFailed: 422,
}


def status_for(error: TaskplatError) -> int:
    for error_type in type(error).__mro__:
        if error_type in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[error_type]
    return 500


def json_response(model: Any, status_code: int = 200) -> Response:
    body = model.model_dump_json(by_alias=True)
    return Response(body, status_code=status_code, media_type="application/json")


def error_response(status_code: int, code: str, message: str, detail: Any = None) -> Response:
    return json_response(ErrorResponse(error=code, message=message, detail=detail), status_code)


async def handle_taskplat_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TaskplatError)
    if isinstance(exc, Rejected):
        status = 404 if exc.reason == "NotFound" else 409
        body = RejectedResponse(reason=exc.reason, message=exc.message)
        return json_response(body, status)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    response = error_response(status_for(exc), exc.code, exc.message, exc.detail)
    if headers:
        response.headers.update(headers)
    return response


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    response = error_response(exc.status_code, code, str(exc.detail))
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def handle_database_unavailable(request: Request, exc: Exception) -> Response:
    get_logger(__name__).error(
        "database_unavailable", path=request.url.path, error=type(exc).__name__
    )
    return error_response(503, "unavailable", "the database is unavailable; retry later")


async def handle_unstorable_value(request: Request, exc: Exception) -> Response:
    """A value the contracts let through but Postgres refuses (SQLSTATE class 22): the client's."""
    get_logger(__name__).warning(
        "unstorable_value", path=request.url.path, error=type(exc).__name__
    )
    first_line = (str(exc).splitlines() or ["invalid value"])[0]
    return error_response(422, "validation_error", f"a value cannot be stored: {first_line}")


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    get_logger(__name__).exception("unhandled_error", path=request.url.path)
    return JSONResponse(
        {"error": "internal_error", "message": "internal error", "detail": None}, status_code=500
    )


EXCEPTION_HANDLERS: dict[Any, Any] = {
    TaskplatError: handle_taskplat_error,
    HTTPException: handle_http_exception,
    PoolTimeout: handle_database_unavailable,
    psycopg.OperationalError: handle_database_unavailable,
    psycopg.DataError: handle_unstorable_value,
    Exception: handle_unexpected,
}
