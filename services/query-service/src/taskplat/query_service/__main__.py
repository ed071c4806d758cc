"""`python -m taskplat.query_service`: settings -> logging -> telemetry -> app -> uvicorn.

Invariant: only wiring lives here; a settings error exits with status 2 and a message, not a
traceback; the process's one `Telemetry` is shut down when the server stops.
"""

from __future__ import annotations

import sys

import uvicorn
from pydantic import ValidationError

from taskplat.common.logging import get_logger
from taskplat.common.process_exit import exit_process
from taskplat.common.service_setup import configure_service
from taskplat.common.telemetry import Telemetry
from taskplat.query_service.app import create_app
from taskplat.query_service.settings import QuerySettings

SERVICE = "query-service"


def main() -> int:
    try:
        settings = QuerySettings()
    except ValidationError as exc:
        print(f"taskplat-query-service: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    configure_service(SERVICE, settings)
    telemetry = Telemetry(SERVICE, settings.telemetry_settings())
    get_logger().info("query_service_starting", host=settings.host, port=settings.port)
    try:
        uvicorn.run(
            create_app(settings, telemetry=telemetry),
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
        )
    finally:
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    exit_process(main())
