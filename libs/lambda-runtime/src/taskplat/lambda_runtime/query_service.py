"""`query(sql, params)`: read the datasets of the task's capability token through the Query
Service (`POST {TASKPLAT_QUERY_URL}/query`, the capability token as bearer credential; standard
library HTTP only).

Invariants: the token is the running attempt's (Lambda: the invocation's `capability_token`),
else `TASKPLAT_CAPABILITY_TOKEN` (the wrapper sets it for untrusted tasks); the body is
`{sql, params?, max_rows?, format: "json"}`; any answer but 200 raises `QueryError` (an
`OperatorFailure`: an uncaught one fails the task with its message), naming the service's
`error` and `message`. The TypeScript and Rust runtimes behave the same.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from taskplat.lambda_runtime.dispatcher import USER_AGENT
from taskplat.lambda_runtime.operator import OperatorFailure, current_channel

QUERY_URL_ENV = "TASKPLAT_QUERY_URL"
CAPABILITY_TOKEN_ENV = "TASKPLAT_CAPABILITY_TOKEN"


class QueryError(OperatorFailure):
    """The Query Service refused or failed the query."""

    def __init__(self, status: int, body: dict[str, Any], message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def query(
    sql: str,
    params: list[Any] | None = None,
    *,
    max_rows: int | None = None,
    timeout_seconds: float = 300.0,
) -> dict[str, Any]:
    """Run one read-only statement over the datasets of the task's capability token: the
    answer `{columns: [{name, type}], rows, row_count, truncated, elapsed_ms}`."""
    url = os.environ.get(QUERY_URL_ENV)
    if not url:
        raise OperatorFailure(f"query needs {QUERY_URL_ENV} (the Query Service's URL)")
    channel = current_channel()
    token = getattr(channel, "capability_token", None) or os.environ.get(CAPABILITY_TOKEN_ENV)
    if not token:
        raise OperatorFailure("query needs the task's capability token (untrusted jobs have one)")
    body: dict[str, Any] = {"sql": sql}
    if params is not None:
        body["params"] = params
    if max_rows is not None:
        body["max_rows"] = max_rows
    body["format"] = "json"
    request = urllib.request.Request(
        url.rstrip("/") + "/query",
        data=json.dumps(body, separators=(",", ":")).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            answer: dict[str, Any] = json.loads(response.read() or b"{}")
            return answer
    except urllib.error.HTTPError as exc:
        try:
            error_body = json.loads(exc.read() or b"{}")
        except (ValueError, OSError):
            error_body = {}
        if not isinstance(error_body, dict):
            error_body = {}
        what = "refused" if exc.code < 500 else "failed"
        detail = f"{error_body.get('error', 'error')}: {error_body.get('message', '')}"
        raise QueryError(exc.code, error_body, f"query {what} ({exc.code}): {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise QueryError(0, {}, f"query failed: {exc}") from None
