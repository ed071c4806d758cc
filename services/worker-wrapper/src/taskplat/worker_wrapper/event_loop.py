"""The wrapper's event loop: uvloop when it can be used safely, else asyncio's.

Invariants:
  * `auto` takes uvloop only when it is installed and the kernel can mark every inherited
    descriptor close-on-exec in one call (`process.cloexec_all_supported`): uvloop's spawn does
    not close the wrapper's descriptors, so without that an operator could inherit the wrapper's
    sockets. Otherwise `auto` is asyncio's loop, which behaves the same, only slower.
  * `uvloop` insists: `EventLoopUnavailable` (a start-up error naming why) when it cannot be used;
    `asyncio` never uses uvloop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from taskplat.worker_wrapper.process import cloexec_all_supported

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


class EventLoopUnavailable(Exception):
    """The event loop the settings ask for cannot be used here."""


def loop_factory(choice: Literal["auto", "uvloop", "asyncio"] | str) -> LoopFactory | None:
    """The factory of the loop to run the wrapper on (None: asyncio's default)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise EventLoopUnavailable(
                "TASKPLAT_WORKER_EVENT_LOOP=uvloop, but uvloop is not installed"
            ) from None
        return None
    if not cloexec_all_supported():
        if choice == "uvloop":
            raise EventLoopUnavailable(
                "TASKPLAT_WORKER_EVENT_LOOP=uvloop needs close_range with CLOSE_RANGE_CLOEXEC "
                "(Linux 5.11+), so operators inherit no descriptor of the wrapper"
            )
        return None
    return uvloop.new_event_loop
