"""The entry point shared by the database loop services (scheduler, reaper, relay, sink).

Wiring order: settings -> logging -> telemetry -> pool -> the service's objects -> ops server ->
signals -> run. Invariants: bad settings (or an ops port that cannot be bound) exit with status 2
and one line on stderr, never a traceback; a service that needs its database at start
(`wait_for_database`) exits 1 with one line when it cannot connect in time; SIGTERM/SIGINT end the
loop after the batch in progress, then the ops server, the service's objects, the pool and the
telemetry are shut down, in that order.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout
from pydantic import ValidationError

from taskplat.common.db.pools import make_pool
from taskplat.common.logging import get_logger
from taskplat.common.loops import LoopHealth, install_stop_signals
from taskplat.common.ops_server import start_ops_server
from taskplat.common.service_setup import configure_service
from taskplat.common.telemetry import Telemetry


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class LoopProcess:
    """What a loop service runs: `run(stop)` until `stop` is set, its `/healthz` answer, and
    what to close once it returned (or when the ops server could not start)."""

    run: Callable[[threading.Event], None]
    health: Callable[[], tuple[bool, str]]
    close: Callable[[], None] = _nothing


# (settings, pool, telemetry) -> the service's objects, ready to run.
BuildLoop = Callable[[Any, ConnectionPool[Any], Telemetry], LoopProcess]
# (settings, pool, telemetry, stop, health) -> runs a plain loop until `stop` is set.
RunLoop = Callable[[Any, ConnectionPool[Any], Telemetry, threading.Event, LoopHealth], None]


def settings_error(exc: ValidationError) -> str:
    """One line naming every invalid setting."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors()
    )


def plain_loop(run: RunLoop) -> BuildLoop:
    """A `BuildLoop` for a loop that keeps a `LoopHealth` and owns nothing to close."""

    def build(settings: Any, pool: ConnectionPool[Any], telemetry: Telemetry) -> LoopProcess:
        health = LoopHealth()
        return LoopProcess(
            run=lambda stop: run(settings, pool, telemetry, stop, health),
            health=lambda: health.check(settings.stall_seconds),
        )

    return build


def run_db_loop_service(
    service: str,
    load_settings: Callable[[], Any],
    build: BuildLoop,
    describe: Callable[[Any], dict[str, object]],
    *,
    wait_for_database: bool = False,
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
    pool = make_pool(settings, application_name=name)
    try:
        pool.open(wait=wait_for_database, timeout=settings.db_connect_timeout_seconds)
    except PoolTimeout:
        pool.close()
        telemetry.shutdown()
        print(f"{name}: cannot connect to the database", file=sys.stderr)
        return 1
    process = build(settings, pool, telemetry)
    try:
        ops = start_ops_server(settings, telemetry, process.health)
    except OSError as exc:
        process.close()
        pool.close()
        telemetry.shutdown()
        print(
            f"{name}: invalid settings: cannot serve ops on "
            f"{settings.ops_host}:{settings.ops_port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    install_stop_signals(stop)
    get_logger().info(
        f"{service.replace('-', '_')}_starting",
        interval_seconds=settings.interval_seconds,
        ops_port=ops.port if ops is not None else None,
        tracing=telemetry.tracing,
        **describe(settings),
    )
    try:
        process.run(stop)
    finally:
        if ops is not None:
            ops.stop()
        process.close()
        pool.close()
        telemetry.shutdown()
    return 0
