"""`query()` carries the task's W3C trace context to the query service (a real local HTTP
server records the request): the task line's `traceparent` under `serve`, else `TRACEPARENT`, and
no header when the task is untraced."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from taskplat.lambda_runtime import Task, query, serve

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ANSWER = {"columns": [], "rows": [], "row_count": 0, "truncated": False, "elapsed_ms": 1}


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps(ANSWER).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, str]]]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TASKPLAT_QUERY_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("TASKPLAT_CAPABILITY_TOKEN", "token")
    monkeypatch.delenv("TRACEPARENT", raising=False)
    try:
        yield _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


def _serve_one(**fields: Any) -> None:
    def handle(task: Task) -> dict[str, Any]:
        return {"rows": query("SELECT 1").row_count}

    doc = {
        "task_id": "t-1",
        "attempt": 1,
        "lease_token": "l",
        "operator": "op",
        "queue": "default",
        "config": {},
        "inputs": [],
        "job": None,
        "timeout_seconds": None,
        "deadline_at": None,
        "outputs": [],
        **fields,
    }
    out = io.StringIO()
    assert serve(handle, stdin=io.StringIO(json.dumps(doc) + "\n"), stdout=out) == 0
    assert json.loads(out.getvalue().splitlines()[-1])["status"] == "succeeded", out.getvalue()


def test_the_task_lines_traceparent_goes_with_the_query(service: list[dict[str, str]]) -> None:
    _serve_one(traceparent=TRACEPARENT)
    assert [headers.get("traceparent") for headers in service] == [TRACEPARENT]


def test_traceparent_from_the_environment_outside_a_task(
    service: list[dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACEPARENT", TRACEPARENT)
    query("SELECT 1")
    assert [headers.get("traceparent") for headers in service] == [TRACEPARENT]


def test_an_untraced_task_sends_no_trace_header(service: list[dict[str, str]]) -> None:
    _serve_one()
    assert len(service) == 1 and "traceparent" not in service[0]
