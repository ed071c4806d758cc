"""`python -m taskplat.dispatcher`: settings -> logging -> telemetry -> app -> uvicorn.

Invariant: only wiring lives here; a settings error exits non-zero with a message, not a traceback;
the process's one `Telemetry` is shut down (pending spans flushed) when the server stops.
"""

from __future__ import annotations

import sys

import uvicorn
from pydantic import ValidationError

from taskplat.common.errors import ConfigurationError
from taskplat.common.logging import get_logger
from taskplat.common.process_exit import exit_process
from taskplat.common.service_setup import configure_service
from taskplat.common.telemetry import Telemetry
from taskplat.dispatcher.app import create_app
from taskplat.dispatcher.server_impl import choose_server_impl
from taskplat.dispatcher.settings import DispatcherSettings


def main() -> int:
    try:
        settings = DispatcherSettings()
    except ValidationError as exc:
        print(f"taskplat-dispatcher: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    try:
        impl = choose_server_impl(settings)
    except ConfigurationError as exc:
        print(f"taskplat-dispatcher: invalid settings: {exc.message}", file=sys.stderr)
        return 2
    configure_service("dispatcher", settings)
    telemetry = Telemetry("dispatcher", settings.telemetry_settings())
    log = get_logger()
    log.info(
        "dispatcher_starting", host=settings.host, port=settings.port, tracing=telemetry.tracing
    )
    log.info(
        "dispatcher_server_impl",
        loop=impl.loop,
        http=impl.http,
        fallback=f"{', '.join(impl.missing)} not installed" if impl.missing else None,
    )
    try:
        uvicorn.run(
            create_app(settings, telemetry=telemetry),
            host=settings.host,
            port=settings.port,
            loop=impl.loop,
            http=impl.http,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=20,
        )
    finally:
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    exit_process(main())
