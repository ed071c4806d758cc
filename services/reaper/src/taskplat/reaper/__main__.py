"""`python -m taskplat.reaper`: settings -> logging -> telemetry -> ops server -> signals -> pool
-> reaper -> loop.

Invariant: only wiring lives here; bad settings (or an ops port that cannot be bound) exit with
status 2 and one line on stderr, never a traceback. SIGTERM/SIGINT end the loop after the batch in
progress; the ops server, the telemetry and the pool are then shut down.
"""

from __future__ import annotations

import sys
import threading

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from pydantic import ValidationError

from taskplat.common.db.pools import make_pool
from taskplat.common.logging import configure_logging, get_logger
from taskplat.common.loops import LoopHealth, install_stop_signals
from taskplat.common.ops_server import start_ops_server
from taskplat.common.telemetry import Telemetry
from taskplat.reaper.reaper import Reaper
from taskplat.reaper.settings import ReaperSettings

NAME = "taskplat-reaper"


def settings_error(exc: ValidationError) -> str:
    """One line naming every invalid setting."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors()
    )


def main() -> int:
    try:
        settings = ReaperSettings()
        conninfo_to_dict(settings.database_url.get_secret_value())
    except ValidationError as exc:
        print(f"{NAME}: invalid settings: {settings_error(exc)}", file=sys.stderr)
        return 2
    except ProgrammingError:
        print(f"{NAME}: invalid settings: DATABASE_URL is not a valid libpq URL", file=sys.stderr)
        return 2
    configure_logging("reaper", level=settings.log_level, fmt=settings.log_format)
    telemetry = Telemetry("reaper", settings)
    health = LoopHealth()
    try:
        ops = start_ops_server(settings, telemetry, lambda: health.check(settings.stall_seconds))
    except OSError as exc:
        telemetry.shutdown()
        print(
            f"{NAME}: invalid settings: cannot serve ops on "
            f"{settings.ops_host}:{settings.ops_port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    install_stop_signals(stop)
    pool = make_pool(settings, application_name=NAME)
    pool.open(wait=False)
    get_logger().info(
        "reaper_starting",
        interval_seconds=settings.interval_seconds,
        deadline_grace_seconds=settings.deadline_grace_seconds,
        retention_seconds=settings.retention_seconds,
        ops_port=ops.port if ops is not None else None,
        tracing=telemetry.tracing,
    )
    try:
        Reaper(pool, settings, telemetry=telemetry).run(stop, health=health)
    finally:
        if ops is not None:
            ops.stop()
        pool.close()
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
