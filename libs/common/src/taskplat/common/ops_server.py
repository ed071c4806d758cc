"""The operational HTTP endpoint of a loop or worker process: `/metrics` and `/healthz`.

Invariants: it serves on its own thread and never touches the service's work; `/healthz` answers
200 while the process makes progress and 503 with the reason once it stopped (the check is the
caller's); `/metrics` is this process's Prometheus text. It binds only when a port is configured.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import Field
from pydantic_settings import BaseSettings

from taskplat.common.telemetry import PROMETHEUS_CONTENT_TYPE, Telemetry

HealthCheck = Callable[[], tuple[bool, str]]


class OpsSettings(BaseSettings):
    """Fragment: where a loop or worker serves `/metrics` and `/healthz` (service env prefix)."""

    ops_host: str = Field(
        "127.0.0.1", description="Address of /metrics and /healthz (0.0.0.0 in a container)."
    )
    ops_port: int | None = Field(
        None, ge=0, le=65535, description="Port of /metrics and /healthz; unset = not served."
    )
    stall_seconds: float = Field(
        60.0, gt=0, description="/healthz turns 503 when the loop made no progress for this long."
    )


class OpsServer:
    def __init__(self, telemetry: Telemetry, health: HealthCheck, *, host: str, port: int) -> None:
        handler = _handler(telemetry, health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ops-server", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> OpsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(telemetry: Telemetry, health: HealthCheck) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, telemetry.prometheus_text(), PROMETHEUS_CONTENT_TYPE)
            elif path == "/healthz":
                ok, reason = health()
                body = {"status": "ok" if ok else "unhealthy", "reason": reason}
                self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
            else:
                self._send(404, b'{"error": "not_found"}', "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
            return

    return Handler


def start_ops_server(
    settings: OpsSettings, telemetry: Telemetry, health: HealthCheck
) -> OpsServer | None:
    if settings.ops_port is None:
        return None
    return OpsServer(telemetry, health, host=settings.ops_host, port=settings.ops_port).start()
