"""`python -m taskplat.sink`: the shared database-loop entry point running the sink.

Invariant: only wiring lives here (see `taskplat.common.db.loop_service`): bad settings (or an ops
port that cannot be bound) exit 2 and an unreachable database at start-up exits 1, each with one
line on stderr; SIGTERM/SIGINT end the loop after the batch in progress, then the sink's SQS
client is closed.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import ConnectionPool

from taskplat.common.db.loop_service import LoopProcess, run_db_loop_service
from taskplat.common.process_exit import exit_process
from taskplat.common.sqs import sqs_client
from taskplat.common.telemetry import Telemetry
from taskplat.sink.settings import SinkSettings
from taskplat.sink.sink import Sink


def build(settings: SinkSettings, pool: ConnectionPool[Any], telemetry: Telemetry) -> LoopProcess:
    sqs = sqs_client(settings, max_pool_connections=settings.concurrency * 2 + 4)
    sink = Sink(settings, pool=pool, sqs=sqs, telemetry=telemetry)
    return LoopProcess(
        run=sink.run,
        health=lambda: sink.health.check(settings.stall_seconds),
        close=sink.close,
    )


def main() -> int:
    return run_db_loop_service(
        "sink",
        SinkSettings,
        build,
        lambda settings: {
            "concurrency": settings.concurrency,
            "wait_time_seconds": settings.wait_time_seconds,
            "discovery_interval_seconds": settings.discovery_interval_seconds,
        },
        wait_for_database=True,
    )


if __name__ == "__main__":
    exit_process(main())
