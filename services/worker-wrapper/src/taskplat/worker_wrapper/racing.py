"""Waiting for a piece of work, a stop signal, or a deadline, whichever comes first.

Invariant: `race` never cancels `work`; the caller decides what to do with it (kill the operator
first, then cancel the reading). When `work` finished, that wins over a simultaneous stop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from taskplat.worker_wrapper.outcomes import Abort

Finish = Literal["done", "stopped", "deadline"]


async def race(work: asyncio.Future[Any], abort: Abort, deadline: float | None) -> Finish:
    """Wait for `work`, `abort` or `deadline` (event-loop time, None for none)."""
    loop = asyncio.get_running_loop()
    stop_waiter = asyncio.ensure_future(abort.wait())
    try:
        timeout = None if deadline is None else max(0.0, deadline - loop.time())
        done, _ = await asyncio.wait(
            {work, stop_waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        stop_waiter.cancel()
    if work in done:
        return "done"
    if abort.is_set:
        return "stopped"
    return "deadline"


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` (if still running) and wait for it to end, swallowing its outcome."""
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def deadline_message(elapsed: float) -> str:
    return f"deadline exceeded after {elapsed:.1f} s; operator killed"
