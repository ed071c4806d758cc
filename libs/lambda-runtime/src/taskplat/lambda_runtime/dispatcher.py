"""The calls a Lambda attempt makes to the dispatcher, with its attempt token (standard library
HTTP only).

Invariants: every call names the attempt's `(task_id, attempt, lease_token)` and carries the
attempt token as its bearer credential, never the worker token; a 4xx answer (401 bad token, 403
another attempt, 404 no task, 409 stale attempt or lease) raises `Refused`, which is final: the
attempt no longer holds the task; a transport error or a 5xx is retried with a doubling delay
while the caller's time allows, then raises `Unreachable`.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

USER_AGENT = "taskplat-lambda-runtime/0.1"


class DispatcherError(Exception):
    pass


class Refused(DispatcherError):
    """The dispatcher refused the call for this attempt (stale, lost lease, bad token)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.reason = str(body.get("reason") or body.get("error") or status)
        super().__init__(f"refused ({status}): {self.reason}: {body.get('message', '')}")


class Unreachable(DispatcherError):
    """The dispatcher did not answer in time."""


class AttemptApi:
    def __init__(
        self,
        url: str,
        *,
        attempt_token: str,
        task_id: str,
        attempt: int,
        lease_token: str,
        seconds_left: Callable[[], float],
        request_timeout: float = 10.0,
    ) -> None:
        self._url = url.rstrip("/")
        self._token = attempt_token
        self._fence = {"task_id": task_id, "attempt": attempt, "lease_token": lease_token}
        self._seconds_left = seconds_left
        self._timeout = request_timeout

    def heartbeat(self) -> dict[str, Any]:
        return self._post("/internal/heartbeat", {})

    def events(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        return self._post("/internal/events", {"events": events})

    def step(self, name: str, result: Any) -> Any:
        """Record a step's result; the one that stands (the first recorded)."""
        return self._post("/internal/steps", {"step": name, "result": result}).get("result")

    def complete(self, status: str, **fields: Any) -> dict[str, Any]:
        sent = {key: value for key, value in fields.items() if value or value is False}
        body = {"status": status, **sent}
        return self._post("/internal/task-complete", body)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps({**self._fence, **body}, separators=(",", ":")).encode()
        delay = 0.2
        while True:
            request = urllib.request.Request(
                self._url + path,
                data=data,
                method="POST",
                headers={
                    "Authorization": f"Bearer {self._token}",
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                    "User-Agent": USER_AGENT,
                },
            )
            timeout = max(0.5, min(self._timeout, self._seconds_left()))
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    answer: dict[str, Any] = json.loads(response.read() or b"{}")
                    return answer
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise Refused(exc.code, _json_body(exc)) from None
                problem = f"{path} answered {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                problem = f"{path}: {exc}"
            if self._seconds_left() <= delay + 0.5:
                raise Unreachable(f"cannot reach the dispatcher at {self._url}: {problem}")
            time.sleep(delay)  # a retry pause, bounded by the attempt's time left
            delay = min(delay * 2, 5.0)


def _json_body(exc: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        body = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return {}
    return body if isinstance(body, dict) else {}
