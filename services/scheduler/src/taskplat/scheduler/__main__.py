"""`python -m taskplat.scheduler`: settings -> logging -> pool -> scheduler -> signals -> loop.

Invariant: only wiring lives here; bad settings exit with status 2 and one line on stderr, never a
traceback. SIGTERM/SIGINT end the loop after the batch in progress.
"""

from __future__ import annotations

import sys
import threading

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from pydantic import ValidationError

from taskplat.common.db.pools import make_pool
from taskplat.common.logging import configure_logging, get_logger
from taskplat.common.loops import install_stop_signals
from taskplat.scheduler.scheduler import Scheduler
from taskplat.scheduler.settings import SchedulerSettings

NAME = "taskplat-scheduler"


def settings_error(exc: ValidationError) -> str:
    """One line naming every invalid setting."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors()
    )


def main() -> int:
    try:
        settings = SchedulerSettings()
        conninfo_to_dict(settings.database_url.get_secret_value())
    except ValidationError as exc:
        print(f"{NAME}: invalid settings: {settings_error(exc)}", file=sys.stderr)
        return 2
    except ProgrammingError:
        print(f"{NAME}: invalid settings: DATABASE_URL is not a valid libpq URL", file=sys.stderr)
        return 2
    configure_logging("scheduler", level=settings.log_level, fmt=settings.log_format)
    stop = threading.Event()
    install_stop_signals(stop)
    pool = make_pool(settings, application_name=NAME)
    pool.open(wait=False)
    get_logger().info(
        "scheduler_starting",
        interval_seconds=settings.interval_seconds,
        requeue_after_seconds=settings.requeue_after_seconds,
    )
    try:
        Scheduler(pool, settings).run(stop)
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
