"""The one root exception of Taskplat and its domain errors.

Invariant: every error a service raises on purpose derives from `TaskplatError`. HTTP status codes
are assigned in one table (`taskplat.dispatcher.errors`), never at the raise site.
"""

from __future__ import annotations

from typing import Any


class TaskplatError(Exception):
    """Root of every deliberate Taskplat error. `code` is a stable snake_case identifier."""

    code = "error"

    def __init__(self, message: str, *, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class BadRequest(TaskplatError):
    code = "bad_request"


class MalformedJson(BadRequest):
    code = "malformed_json"


class ValidationFailed(TaskplatError):
    code = "validation_error"


class PayloadTooLarge(TaskplatError):
    code = "payload_too_large"


class Unauthorized(TaskplatError):
    code = "unauthorized"


class Forbidden(TaskplatError):
    """A valid credential that does not authorize this call (e.g. an attempt token used for another
    attempt or another route)."""

    code = "forbidden"


class NotFound(TaskplatError):
    code = "not_found"


class Conflict(TaskplatError):
    code = "conflict"


class PinnedVersionNotCurrent(Conflict):
    """A replay of a task pinned to a dataset version that is no longer current (without
    `repin`). Its code is the reason name the API documents."""

    code = "PinnedVersionNotCurrent"


class Rejected(TaskplatError):
    """A worker call refused by the fencing rules; `reason` is one of the contract's reasons."""

    code = "rejected"

    def __init__(self, reason: str, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason = reason


class ConfigurationError(TaskplatError):
    code = "configuration_error"
