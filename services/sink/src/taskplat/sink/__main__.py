"""`python -m taskplat.sink`: settings -> logging -> pool -> telemetry -> SQS client ->
sink -> ops server -> signals -> run.

Invariant: only wiring lives here. Bad settings (or an ops port that cannot be bound) or an
unreachable database at start-up exit non-zero with a one-line message, never a traceback; once
running, errors are the loop's to log. On exit the ops server, the sink, the pool and the telemetry
are shut down.
"""

from __future__ import annotations

import sys
import threading

from psycopg_pool import PoolTimeout
from pydantic import ValidationError

from taskplat.common.db.loop_service import settings_error
from taskplat.common.db.pools import make_pool
from taskplat.common.logging import get_logger
from taskplat.common.loops import install_stop_signals
from taskplat.common.ops_server import start_ops_server
from taskplat.common.service_setup import configure_service
from taskplat.common.sqs import sqs_client
from taskplat.common.telemetry import Telemetry
from taskplat.sink.settings import SinkSettings
from taskplat.sink.sink import Sink

SERVICE = "sink"


def main() -> int:
    try:
        settings = SinkSettings()
    except ValidationError as exc:
        print(f"taskplat-{SERVICE}: invalid settings: {settings_error(exc)}", file=sys.stderr)
        return 2
    configure_service(SERVICE, settings)
    log = get_logger()
    pool = make_pool(settings, application_name=f"taskplat-{SERVICE}")
    try:
        pool.open(wait=True, timeout=settings.db_connect_timeout_seconds)
    except PoolTimeout:
        pool.close()
        print(f"taskplat-{SERVICE}: cannot connect to the database", file=sys.stderr)
        return 1
    telemetry = Telemetry(SERVICE, settings)
    sqs = sqs_client(settings, max_pool_connections=settings.concurrency * 2 + 4)
    sink = Sink(settings, pool=pool, sqs=sqs, telemetry=telemetry)
    try:
        ops = start_ops_server(
            settings, telemetry, lambda: sink.health.check(settings.stall_seconds)
        )
    except OSError as exc:
        sink.close()
        pool.close()
        telemetry.shutdown()
        print(
            f"taskplat-{SERVICE}: invalid settings: cannot serve ops on "
            f"{settings.ops_host}:{settings.ops_port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    install_stop_signals(stop)
    log.info(
        "sink_starting",
        concurrency=settings.concurrency,
        wait_time_seconds=settings.wait_time_seconds,
        discovery_interval_seconds=settings.discovery_interval_seconds,
        ops_port=ops.port if ops is not None else None,
        tracing=telemetry.tracing,
    )
    try:
        sink.run(stop)
    finally:
        if ops is not None:
            ops.stop()
        sink.close()
        pool.close()
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
