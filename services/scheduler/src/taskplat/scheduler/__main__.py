"""`python -m taskplat.scheduler`: the shared database-loop entry point running the scheduler.

Invariant: only wiring lives here (see `taskplat.common.db.loop_service`): bad settings exit 2 with
one line on stderr; SIGTERM/SIGINT end the loop after the batch in progress.
"""

from __future__ import annotations

from taskplat.common.db.loop_service import plain_loop, run_db_loop_service
from taskplat.common.process_exit import exit_process
from taskplat.scheduler.scheduler import Scheduler
from taskplat.scheduler.settings import SchedulerSettings


def main() -> int:
    return run_db_loop_service(
        "scheduler",
        SchedulerSettings,
        plain_loop(
            lambda settings, pool, telemetry, stop, health: Scheduler(
                pool, settings, telemetry=telemetry
            ).run(stop, health=health)
        ),
        lambda settings: {"requeue_after_seconds": settings.requeue_after_seconds},
    )


if __name__ == "__main__":
    exit_process(main())
