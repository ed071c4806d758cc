"""`python -m taskplat.outbox_relay`: the shared database-loop entry point running the relay and
its Lambda invoker (on a thread of its own).

Invariant: only wiring lives here (see `taskplat.common.db.loop_service`): bad settings (or an ops
port that cannot be bound) exit 2 and an unreachable database at start-up exits 1, each with one
line on stderr. The process is healthy while both loops make progress; a stop ends both, the
invoker joined before the relay is closed.
"""

from __future__ import annotations

import threading
from typing import Any

from psycopg_pool import ConnectionPool

from taskplat.common.db.loop_service import LoopProcess, run_db_loop_service
from taskplat.common.process_exit import exit_process
from taskplat.common.sqs import sqs_client
from taskplat.common.telemetry import Telemetry
from taskplat.outbox_relay.lambda_invoker import Invoker, lambda_client
from taskplat.outbox_relay.relay import Relay
from taskplat.outbox_relay.settings import RelaySettings


def build(settings: RelaySettings, pool: ConnectionPool[Any], telemetry: Telemetry) -> LoopProcess:
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

    def run(stop: threading.Event) -> None:
        invoking = threading.Thread(target=invoker.run, args=(stop,), name="lambda-invoker")
        invoking.start()
        try:
            relay.run(stop)
        finally:
            stop.set()
            invoking.join()

    return LoopProcess(run=run, health=health, close=relay.close)


def main() -> int:
    return run_db_loop_service(
        "outbox-relay",
        RelaySettings,
        build,
        lambda settings: {
            "batch_size": settings.batch_size,
            "send_concurrency": settings.send_concurrency,
            "skip_not_queued": settings.skip_not_queued,
            "lambda_signing": settings.attempt_token_key_settings() is not None,
        },
        wait_for_database=True,
    )


if __name__ == "__main__":
    exit_process(main())
