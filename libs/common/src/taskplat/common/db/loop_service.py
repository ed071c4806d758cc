"""The entry point shared by the database loops that need nothing but Postgres (scheduler, reaper).

Wiring order: settings -> logging -> telemetry -> ops server -> signals -> pool -> loop. Invariants:
bad settings (or an ops port that cannot be bound) exit with status 2 and one line on stderr, never
a traceback; SIGTERM/SIGINT end the loop after the batch in progress, then the ops server, the pool
and the telemetry are shut down.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool
from pydantic import ValidationError

from taskplat.common.db.pools import make_pool
from taskplat.common.logging import get_logger
from taskplat.common.loops import LoopHealth, install_stop_signals
from taskplat.common.ops_server import start_ops_server
from taskplat.common.service_setup import configure_service
from taskplat.common.telemetry import Telemetry

# (settings, pool, telemetry, stop, health) -> runs the loop until `stop` is set.
RunLoop = Callable[[Any, ConnectionPool[Any], Telemetry, threading.Event, LoopHealth], None]


def settings_error(exc: ValidationError) -> str:
    """One line naming every invalid setting."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors()
    )


def run_db_loop_service(
    service: str,
    load_settings: Callable[[], Any],
    run: RunLoop,
    describe: Callable[[Any], dict[str, object]],
) -> int:
    """Run one loop service; `describe(settings)` gives the fields of its start-up log line."""
    name = f"taskplat-{service}"
    try:
        settings = load_settings()
        conninfo_to_dict(settings.database_url.get_secret_value())
    except ValidationError as exc:
        print(f"{name}: invalid settings: {settings_error(exc)}", file=sys.stderr)
        return 2
    except ProgrammingError:
        print(f"{name}: invalid settings: DATABASE_URL is not a valid libpq URL", file=sys.stderr)
        return 2
    configure_service(service, settings)
    telemetry = Telemetry(service, settings)
    health = LoopHealth()
    try:
        ops = start_ops_server(settings, telemetry, lambda: health.check(settings.stall_seconds))
    except OSError as exc:
        telemetry.shutdown()
        print(
            f"{name}: invalid settings: cannot serve ops on "
            f"{settings.ops_host}:{settings.ops_port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    install_stop_signals(stop)
    pool = make_pool(settings, application_name=name)
    pool.open(wait=False)
    get_logger().info(
        f"{service}_starting",
        interval_seconds=settings.interval_seconds,
        ops_port=ops.port if ops is not None else None,
        tracing=telemetry.tracing,
        **describe(settings),
    )
    try:
        run(settings, pool, telemetry, stop, health)
    finally:
        if ops is not None:
            ops.stop()
        pool.close()
        telemetry.shutdown()
    return 0
