"""What every service process sets up first, from its settings: logging and the interpreter's
thread switch interval.

Invariants: `configure_service` runs once, in the main thread, before the service starts any
thread of its own. The switch interval (`TASKPLAT_THREAD_SWITCH_INTERVAL_SECONDS`, 0.5 ms) bounds
how long a thread that runs Python keeps the GIL while another thread waits for it. A service
hands work between threads on every task (the relay's LISTEN thread wakes a loop; the wrapper's
SQS receive returns on a pool thread to the event loop), and with Python's default of 5 ms each
such hand-off could wait that long whenever another thread was busy: in W2 the shorter interval
cut the p50 from 39-46 ms to 30-32 ms (docs/performance.md).
"""

from __future__ import annotations

import sys

from taskplat.common.logging import configure_logging
from taskplat.common.settings import ServiceSettings


def configure_service(service: str, settings: ServiceSettings) -> None:
    """Configure logging and the thread switch interval of this process."""
    configure_logging(service, level=settings.log_level, fmt=settings.log_format)
    sys.setswitchinterval(settings.thread_switch_interval_seconds)
