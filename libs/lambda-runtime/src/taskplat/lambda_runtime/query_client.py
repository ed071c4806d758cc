"""`query(sql, params)`: read the task's pinned inputs through the query service.

    from taskplat.lambda_runtime import query

    def handle(task):
        result = query("SELECT a.block, p.price FROM alerts a JOIN prices p USING (block)")
        for row in result.records(): ...

Invariants:
  * Standard library only (urllib); the same call works under the worker wrapper and in Lambda.
  * The capability token is the attempt's own: the current Lambda invocation's
    `capability_token` when there is one, else `TASKPLAT_CAPABILITY_TOKEN` (the wrapper sets it
    for untrusted tasks). The service's URL is `TASKPLAT_QUERY_URL` (the wrapper passes it
    through to every operator; a Lambda function has it in its configuration). The token is
    never logged nor put in an error message.
  * A refusal raises `QueryError` (an `OperatorFailure`: uncaught, it fails the task with its
    message) with the service's status, error code and message (403 names what the statement may
    not touch); a 429 is retried after its `Retry-After`, at most `retries` times, then raised.
    The message reads `query refused (403): <error>: <message>` (`failed` for a 5xx or no answer),
    as in the TypeScript and Rust runtimes (tests/runtimes/contract).
  * The call carries the task's W3C `traceparent` when it has one (`current_traceparent`), so
    the query service's spans are part of the attempt's trace.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from taskplat.lambda_runtime.operator import (
    OperatorFailure,
    current_channel,
    current_traceparent,
)

URL_ENV = "TASKPLAT_QUERY_URL"
TOKEN_ENV = "TASKPLAT_CAPABILITY_TOKEN"
MAX_RETRY_WAIT_SECONDS = 5.0

# The capability token of the Lambda invocation being served (unset under the wrapper).
invocation_token: ContextVar[str | None] = ContextVar("taskplat_capability_token", default=None)


class QueryError(OperatorFailure):
    """The query service refused or failed the query (or could not be reached: status 0)."""

    def __init__(self, status: int, error: str, message: str) -> None:
        what = "refused" if 0 < status < 500 else "failed"
        super().__init__(f"query {what} ({status}): {error}: {message}")
        self.status = status
        self.error = error
        self.message = message


@dataclass(frozen=True)
class QueryResult:
    columns: list[dict[str, str]]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    elapsed_ms: float

    def as_dict(self) -> dict[str, Any]:
        """The service's JSON answer: `{columns, rows, row_count, truncated, elapsed_ms}`."""
        return {
            "columns": self.columns,
            "rows": self.rows,
            "row_count": self.row_count,
            "truncated": self.truncated,
            "elapsed_ms": self.elapsed_ms,
        }

    def records(self) -> list[dict[str, Any]]:
        """The rows as `{column: value}` dicts."""
        names = [c["name"] for c in self.columns]
        return [dict(zip(names, row, strict=True)) for row in self.rows]


def _token(token: str | None) -> str:
    channel = current_channel()
    found = (
        token
        or invocation_token.get()
        or getattr(channel, "capability_token", None)
        or os.environ.get(TOKEN_ENV)
    )
    if not found:
        raise QueryError(
            0,
            "no_capability_token",
            f"no capability token: {TOKEN_ENV} is not set (only untrusted tasks get one)",
        )
    return found


def _url(url: str | None) -> str:
    found = url or os.environ.get(URL_ENV)
    if not found:
        raise QueryError(0, "no_query_url", f"{URL_ENV} is not set")
    return found.rstrip("/") + "/query"


def query_bytes(
    sql: str,
    params: Sequence[Any] | None = None,
    *,
    format: Literal["json", "csv", "arrow"] = "csv",
    max_rows: int | None = None,
    url: str | None = None,
    token: str | None = None,
    timeout: float = 120.0,
    retries: int = 3,
) -> bytes:
    """The answer's bytes (CSV, Arrow IPC stream, or JSON)."""
    body: dict[str, Any] = {"sql": sql, "format": format}
    if params is not None:
        body["params"] = list(params)
    if max_rows is not None:
        body["max_rows"] = max_rows
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {_token(token)}", "Content-Type": "application/json"}
    traceparent = current_traceparent()
    if traceparent:  # the service's spans join the attempt's trace
        headers["traceparent"] = traceparent
    target = _url(url)
    for attempt in range(retries + 1):
        request = urllib.request.Request(target, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                content: bytes = answer.read()
                return content
        except urllib.error.HTTPError as exc:
            error, message = _refusal(exc)
            if exc.code == 429 and attempt < retries:
                wait = float(exc.headers.get("Retry-After") or 1)
                time.sleep(min(max(wait, 0.1), MAX_RETRY_WAIT_SECONDS))
                continue
            raise QueryError(exc.code, error, message) from None
        except (urllib.error.URLError, OSError) as exc:
            raise QueryError(0, "unreachable", f"the query service is unreachable: {exc}") from None
    raise AssertionError("unreachable")


def query(
    sql: str,
    params: Sequence[Any] | None = None,
    *,
    max_rows: int | None = None,
    url: str | None = None,
    token: str | None = None,
    timeout: float = 120.0,
) -> QueryResult:
    """Run one SELECT over the task's pinned inputs (views named by dataset name and
    `dataset_<uuid hex>`); `params` bind `?` / `$1` placeholders."""
    raw = query_bytes(
        sql, params, format="json", max_rows=max_rows, url=url, token=token, timeout=timeout
    )
    answer = json.loads(raw)
    return QueryResult(
        columns=answer["columns"],
        rows=answer["rows"],
        row_count=answer["row_count"],
        truncated=answer["truncated"],
        elapsed_ms=answer["elapsed_ms"],
    )


def _refusal(exc: urllib.error.HTTPError) -> tuple[str, str]:
    try:
        body = json.loads(exc.read() or b"{}")
        return str(body.get("error", "error")), str(body.get("message", exc.reason))
    except (ValueError, OSError):
        return "error", str(exc.reason)
