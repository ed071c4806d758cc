"""`python -m taskplat.outbox_relay`: settings -> logging -> pool -> telemetry -> SQS and Lambda
clients -> relay and Lambda invoker -> ops server -> signals -> run (the invoker on its own thread).

Invariant: only wiring lives here. Bad settings (or an ops port that cannot be bound) or an
unreachable database at start-up exit non-zero with a one-line message, never a traceback; once
running, errors are the loop's to log. On exit the ops server, the relay, the pool and the telemetry
are shut down. The process is healthy while both loops make progress.
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
from taskplat.outbox_relay.invoker import Invoker, lambda_client
from taskplat.outbox_relay.relay import Relay
from taskplat.outbox_relay.settings import RelaySettings

SERVICE = "outbox-relay"


def main() -> int:
    try:
        settings = RelaySettings()
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
    sqs = sqs_client(settings, max_pool_connections=max(10, settings.send_concurrency * 2))
    relay = Relay(settings, pool=pool, sqs=sqs, telemetry=telemetry)
    invoker = Invoker(
        settings,
        pool=pool,
        client=lambda_client(settings, max_pool_connections=settings.lambda_concurrency * 2),
        telemetry=telemetry,
    )

    def health() -> tuple[bool, str]:
        checks = [
            relay.health.check(settings.stall_seconds),
            invoker.health.check(settings.stall_seconds),
        ]
        return all(ok for ok, _ in checks), "; ".join(
            f"{name}: {detail}"
            for name, (_, detail) in zip(("relay", "invoker"), checks, strict=True)
        )

    try:
        ops = start_ops_server(settings, telemetry, health)
    except OSError as exc:
        relay.close()
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
        "relay_starting",
        batch_size=settings.batch_size,
        interval_seconds=settings.interval_seconds,
        send_concurrency=settings.send_concurrency,
        skip_not_queued=settings.skip_not_queued,
        lambda_signing=settings.attempt_token_key_settings() is not None,
        ops_port=ops.port if ops is not None else None,
        tracing=telemetry.tracing,
    )
    invoking = threading.Thread(target=invoker.run, args=(stop,), name="lambda-invoker")
    invoking.start()
    try:
        relay.run(stop)
    finally:
        stop.set()
        invoking.join()
        if ops is not None:
            ops.stop()
        relay.close()
        pool.close()
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
