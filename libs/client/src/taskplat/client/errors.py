"""Errors of the Taskplat client: one root, one class per kind of answer.

Invariants: every error the client raises on purpose derives from `TaskplatError`; an HTTP error
carries the status and the server's JSON error (`error`, `message`, `detail`) as it came; a
dispatcher that cannot be reached raises `Unreachable`; `str(error)` is one line a person can act
on.
"""

from __future__ import annotations

from typing import Any


class TaskplatError(Exception):
    """Root of the client's errors."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unreachable(TaskplatError):
    """The dispatcher did not answer (connection refused, DNS, timeout)."""


class HTTPError(TaskplatError):
    """The dispatcher answered an error; `body` is its JSON error as sent."""

    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code = status_code
        self.body = body
        self.error = str(body.get("error") or body.get("reason") or "error")
        self.detail = body.get("detail")
        text = str(body.get("message") or self.error)
        super().__init__(f"{status_code} {self.error}: {text}")


class BadRequest(HTTPError):
    """400: malformed JSON."""


class Unauthorized(HTTPError):
    """401: a missing or wrong API key."""


class Forbidden(HTTPError):
    """403: the key is valid but lacks the scope the call needs (the message names it)."""


class NotFound(HTTPError):
    """404: no such task (or queue, DAG, dataset)."""


class Conflict(HTTPError):
    """409: the task is in a state that refuses the call."""


class PayloadTooLarge(HTTPError):
    """413: the request body is over the server's cap."""


class ValidationError(HTTPError):
    """422: the request does not match the contract; `detail` names the problem."""


class ServerError(HTTPError):
    """5xx: the dispatcher or its database failed; retry later."""


BY_STATUS: dict[int, type[HTTPError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
}


def error_for(status_code: int, body: dict[str, Any]) -> HTTPError:
    if status_code >= 500:
        return ServerError(status_code, body)
    return BY_STATUS.get(status_code, HTTPError)(status_code, body)
