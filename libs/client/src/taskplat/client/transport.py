"""How a `Call` becomes an HTTP request and its answer a model or an error, for both clients.

Invariants: the API key travels only in the `Authorization` header; a 2xx answer is parsed into
the call's model; any other answer raises the typed error carrying the server's JSON error (a
non-JSON body becomes `{"error": "http_error", "message": <text>}`); transport errors are retried
`retries` times with a doubling delay only as `calls` allows, then raised as `Unreachable`.
"""

from __future__ import annotations

import json
import os
from typing import Any, TypeVar

import httpx

from taskplat.client.calls import Call
from taskplat.client.errors import TaskplatError, Unreachable, error_for

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8080"
RETRY_BASE_SECONDS = 0.2


def settings(url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """The dispatcher URL and API key: arguments first, then TASKPLAT_URL and TASKPLAT_API_KEY."""
    base = url or os.environ.get("TASKPLAT_URL") or DEFAULT_URL
    return base.rstrip("/"), api_key or os.environ.get("TASKPLAT_API_KEY") or None


def headers(api_key: str | None) -> dict[str, str]:
    out = {"Accept": "application/json", "User-Agent": "taskplat-client/0.1"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def request_args(call: Call[Any]) -> dict[str, Any]:
    args: dict[str, Any] = {"params": call.query()}
    if call.body is not None or call.method in {"POST", "PUT"}:
        args["json"] = call.body if call.body is not None else {}
    return args


def retryable(call: Call[Any], exc: httpx.TransportError) -> bool:
    return call.idempotent or isinstance(exc, httpx.ConnectError)


def delay(attempt: int) -> float:
    return float(RETRY_BASE_SECONDS * (2**attempt))


def unreachable(base_url: str, exc: httpx.TransportError) -> Unreachable:
    reason = str(exc) or type(exc).__name__
    return Unreachable(f"cannot reach the dispatcher at {base_url}: {reason}")


def answer(call: Call[T], response: httpx.Response) -> T:
    try:
        body = response.json() if response.content else None
    except json.JSONDecodeError:
        body = None
        if response.is_success:
            raise TaskplatError(
                f"{call.method} {call.path}: the dispatcher answered non-JSON"
            ) from None
    if response.is_success:
        return call.parse(body)
    if not isinstance(body, dict):
        text = response.text.strip().splitlines()[0] if response.text.strip() else ""
        body = {"error": "http_error", "message": text or response.reason_phrase}
    raise error_for(response.status_code, body)
