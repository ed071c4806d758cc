"""Server child processes: spawning, waiting for readiness, stopping.

Invariants:
- Every server leads its own process group (``start_new_session=True``, so pgid == pid) and never
  gets the terminal's Ctrl-C directly; ``Child.stop_group`` signals the whole group: the given
  signal first, SIGKILL after the deadline, and it returns only once the group is gone (or the
  deadline for SIGKILL passed too).
- A child's stdout and stderr are appended to its log file; ``Child.tail`` shows only what this
  child wrote (it remembers the offset at spawn).
- Waits are condition-based with a deadline and end early when the child exits.
- With ``die_with_parent`` the child gets PR_SET_PDEATHSIG on Linux (set after the uid change,
  which would clear it), so a parent killed with SIGKILL leaves no server behind. Use it only from
  a long-lived thread: the signal fires when the spawning *thread* exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.users import RunAs

_PR_SET_PDEATHSIG = 1
TAIL_LINES = 40


def read_tail(path: Path, *, offset: int = 0, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` written after ``offset`` ('' if none or unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:])


def _death_signal_preexec(sig: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is left (one we may not signal counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid`, if it is still there."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Child:
    """A spawned server process and where its output goes."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = TAIL_LINES) -> str:
        return read_tail(self.log_path, offset=self.log_offset, lines=lines)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the leader to exit; return whether it has."""
        try:
            self.popen.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop_group(self, *, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Signal the whole process group, escalate to SIGKILL at the deadline, reap the leader."""
        pgid = self.popen.pid
        deadline = time.monotonic() + timeout
        signal_group(pgid, sig)
        self.wait(deadline - time.monotonic())
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)  # stragglers of the group after the leader exited
        if group_alive(pgid) or self.alive():
            signal_group(pgid, signal.SIGKILL)
            self.wait(5.0)
            kill_deadline = time.monotonic() + 5.0
            while group_alive(pgid) and time.monotonic() < kill_deadline:
                time.sleep(0.05)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str],
    cwd: Path | None = None,
    run_as: RunAs | None = None,
    die_with_parent: bool = False,
    death_signal: int = signal.SIGTERM,
) -> Child:
    """Start ``argv`` in a new process group with output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        offset = log.tell()
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                user=run_as.uid if run_as else None,
                group=run_as.gid if run_as else None,
                extra_groups=[] if run_as else None,
                preexec_fn=_death_signal_preexec(death_signal) if die_with_parent else None,
            )
        except OSError as exc:
            raise DevstackError(f"{name}: cannot start {argv[0]}: {exc}") from exc
    return Child(name=name, popen=popen, log_path=log_path, log_offset=offset)


def wait_until(
    check: Callable[[], bool],
    *,
    child: Child,
    timeout: float,
    interval: float = 0.05,
) -> None:
    """Poll ``check`` until it is true; raise ``DevstackError`` with the log tail when the child
    exits first or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not check():
        if not child.alive():
            raise DevstackError(
                f"{child.name} exited with code {child.popen.returncode} before it was ready; "
                f"log {child.log_path}:\n{child.tail()}"
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DevstackError(
                f"{child.name} was not ready after {timeout:.0f}s; "
                f"log {child.log_path}:\n{child.tail()}"
            )
        child.wait(min(interval, remaining))
