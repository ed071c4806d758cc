"""What running an operator for one task produced, and how a running task is told to stop.

Invariants: an outcome is exactly one of `Succeeded`, `Failed` (with a reason a person can act on,
the tail of stderr appended) or `Stopped` (the wrapper stopped the operator: the task was canceled,
the lease was lost, or the wrapper is draining). The first stop reason given to an `Abort` wins.
A failure message always fits the dispatcher's `error_message` cap.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from taskplat.common.contracts import Event, Output
from taskplat.worker_wrapper.protocol import EventSink

StopReason = Literal["canceled", "lease_lost", "draining"]

REASON_MAX_CHARS = 2000
ERROR_MESSAGE_MAX_CHARS = 16_000


@dataclass(frozen=True)
class Succeeded:
    payload: dict[str, Any] | None
    outputs: Sequence[Output] = ()
    events: Sequence[Event] = ()


@dataclass(frozen=True)
class Failed:
    error_message: str
    # False: the operator failed the task for good (no retry).
    retryable: bool = True


@dataclass(frozen=True)
class Stopped:
    reason: StopReason
    detail: str


RunOutcome = Succeeded | Failed | Stopped


def failure(reason: str, stderr_tail: str = "") -> Failed:
    """A failure whose message is `reason` plus the tail of the operator's stderr."""
    if len(reason) > REASON_MAX_CHARS:
        reason = reason[: REASON_MAX_CHARS - 3] + "..."
    # Postgres text cannot hold NUL characters; an operator's stderr may contain them.
    reason = reason.replace("\x00", "\\0")
    message = reason
    tail = stderr_tail.replace("\x00", "\\0").strip("\n")
    if tail:
        message = f"{reason}\n--- end of stderr ---\n{tail}"
    return Failed(
        message[-ERROR_MESSAGE_MAX_CHARS:] if len(message) > ERROR_MESSAGE_MAX_CHARS else message
    )


class Abort:
    """A one-shot stop signal for one running task, and the wrapper's notice that the task's
    operator has exited (`operator_exited`, at most once: its slot may run another task while
    the outcome is reported)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason: StopReason | None = None
        self.detail = ""
        self._on_exit: Callable[[], None] | None = None

    def when_operator_exits(self, callback: Callable[[], None]) -> None:
        self._on_exit = callback

    def operator_exited(self) -> None:
        callback, self._on_exit = self._on_exit, None
        if callback is not None:
            callback()

    def trigger(self, reason: StopReason, detail: str) -> bool:
        if self.reason is not None:
            return False
        self.reason = reason
        self.detail = detail
        self._event.set()
        return True

    @property
    def is_set(self) -> bool:
        return self.reason is not None

    async def wait(self) -> None:
        await self._event.wait()

    def stopped(self) -> Stopped:
        assert self.reason is not None
        return Stopped(self.reason, self.detail)


@dataclass(frozen=True)
class TaskInput:
    """What an operator receives for one task: the JSON line on stdin and (per-task mode) the
    `TASKPLAT_*` variables."""

    document: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    untrusted: bool = False  # the claim said `trust: untrusted` (its job's trust)

    def line(self) -> bytes:
        return (json.dumps(self.document, separators=(",", ":")) + "\n").encode()


class OperatorRunner(Protocol):
    async def run(
        self,
        task: TaskInput,
        *,
        deadline: float | None,
        forward: EventSink,
        abort: Abort,
    ) -> RunOutcome:
        """Run one task; `deadline` is in event-loop time (`loop.time()`), None for none."""
        ...

    async def warm(self) -> None:
        """Start what should be running before the first task (a pool's warm processes)."""
        ...

    async def close(self) -> None: ...
