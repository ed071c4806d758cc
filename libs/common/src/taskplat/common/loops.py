"""The one shape of every background loop: `run_once()` does a bounded batch; `run_loop()`
repeats it.

Invariants:
  * `run_loop` only waits (the interval, a Postgres NOTIFY, or the stop event) and calls
    `run_once`; all work and all decisions live in `run_once`, which tests call directly.
  * When a batch was full (`result.more` is true) the next batch starts at once; otherwise the loop
    waits up to `interval` seconds, waking early on a NOTIFY.
  * An error in a batch is logged and counted, never fatal: the loop backs off and tries again.
  * `stop` (set by SIGTERM/SIGINT) ends the loop after the batch in progress.
  * With a `Telemetry`, every batch records its duration, its counts (one counter per result
    field), whether it was full (`taskplat.loop.batches{loop,full}`, `full` = "true" when
    `result.more`) and its errors, labelled by loop name; `LoopHealth` tells liveness from
    progress. The share of full batches is each loop's saturation (its scaling signal on ECS).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any, Protocol

from taskplat.common.logging import get_logger
from taskplat.common.metric_specs import (
    LOOP_BATCH_DURATION,
    LOOP_BATCH_SIZE,
    LOOP_BATCHES,
    LOOP_ERRORS,
)
from taskplat.common.telemetry import SIZE_BUCKETS, Telemetry


class BatchResult(Protocol):
    @property
    def more(self) -> bool:
        """True when the batch was full and more work is likely waiting."""
        ...


class Waker(Protocol):
    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True when woken by a notification."""
        ...

    def close(self) -> None: ...


class LoopHealth:
    """Liveness of a loop: the time of its last completed batch (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_progress = time.monotonic()
        self.batches = 0
        self.errors = 0

    def progressed(self) -> None:
        with self._lock:
            self.last_progress = time.monotonic()
            self.batches += 1

    def failed(self) -> None:
        with self._lock:
            self.errors += 1

    def seconds_since_progress(self) -> float:
        with self._lock:
            return time.monotonic() - self.last_progress

    def check(self, stall_seconds: float) -> tuple[bool, str]:
        """Healthy while the last batch finished less than `stall_seconds` ago."""
        idle = self.seconds_since_progress()
        if idle > stall_seconds:
            return False, f"no batch completed for {idle:.0f}s ({self.errors} errors so far)"
        return True, f"last batch {idle:.1f}s ago"


class LoopMetrics:
    """Per-batch instruments of one loop."""

    def __init__(self, telemetry: Telemetry, loop: str) -> None:
        self._attributes = {"loop": loop}
        self._duration = telemetry.histogram(LOOP_BATCH_DURATION)
        self._items = telemetry.histogram(LOOP_BATCH_SIZE, buckets=SIZE_BUCKETS)
        self._batches = telemetry.counter(LOOP_BATCHES)
        self._errors = telemetry.counter(LOOP_ERRORS)

    def batch(self, seconds: float, fields: dict[str, Any], *, full: bool = False) -> None:
        self._duration.record(seconds, self._attributes)
        self._batches.add(1, {**self._attributes, "full": "true" if full else "false"})
        for kind, value in fields.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self._items.record(value, {**self._attributes, "kind": kind})

    def error(self) -> None:
        self._errors.add(1, self._attributes)


def install_stop_signals(stop: threading.Event) -> None:
    """Set `stop` on SIGTERM and SIGINT (call from the main thread)."""

    def handler(signum: int, _frame: object) -> None:
        get_logger().info("stop_requested", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _fields(result: Any) -> dict[str, Any]:
    if is_dataclass(result) and not isinstance(result, type):
        return asdict(result)
    return {"result": repr(result)}


def run_loop(
    name: str,
    run_once: Callable[[], BatchResult],
    stop: threading.Event,
    *,
    interval: float,
    waker: Waker | None = None,
    health: LoopHealth | None = None,
    telemetry: Telemetry | None = None,
    error_backoff: float = 1.0,
    max_error_backoff: float = 30.0,
) -> None:
    """Repeat `run_once` until `stop` is set."""
    log = get_logger().bind(loop=name)
    health = health or LoopHealth()
    metrics = LoopMetrics(telemetry, name) if telemetry is not None else None
    consecutive_errors = 0
    log.info("loop_started", interval=interval)
    while not stop.is_set():
        started = time.monotonic()
        try:
            result = run_once()
        except Exception:
            consecutive_errors += 1
            health.failed()
            if metrics is not None:
                metrics.error()
            delay = min(max_error_backoff, error_backoff * 2 ** (consecutive_errors - 1))
            log.exception(
                "loop_batch_failed", consecutive_errors=consecutive_errors, retry_in=delay
            )
            stop.wait(delay)
            continue
        consecutive_errors = 0
        health.progressed()
        elapsed = time.monotonic() - started
        fields = _fields(result)
        if metrics is not None:
            metrics.batch(elapsed, fields, full=bool(result.more))
        if any(value for key, value in fields.items() if key != "more"):
            log.info("loop_batch", duration_ms=round(elapsed * 1000, 1), **fields)
        if result.more:
            continue
        if waker is not None:
            waker.wait(interval)
        else:
            stop.wait(interval)
    if waker is not None:
        waker.close()
    log.info("loop_stopped")
