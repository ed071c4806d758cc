"""`python -m taskplat.reaper`: the shared database-loop entry point running the reaper.

Invariant: only wiring lives here (see `taskplat.common.db.loop_service`): bad settings exit 2 with
one line on stderr; SIGTERM/SIGINT end the loop after the batch in progress.
"""

from __future__ import annotations

from taskplat.common.db.loop_service import plain_loop, run_db_loop_service
from taskplat.common.process_exit import exit_process
from taskplat.reaper.reaper import Reaper
from taskplat.reaper.settings import ReaperSettings


def main() -> int:
    return run_db_loop_service(
        "reaper",
        ReaperSettings,
        plain_loop(
            lambda settings, pool, telemetry, stop, health: Reaper(
                pool, settings, telemetry=telemetry
            ).run(stop, health=health)
        ),
        lambda settings: {
            "deadline_grace_seconds": settings.deadline_grace_seconds,
            "retention_seconds": settings.retention_seconds,
        },
    )


if __name__ == "__main__":
    exit_process(main())
