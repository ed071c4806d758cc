"""Operator child processes: spawning, their environment, their stderr, killing their group.

Invariants:
  * Every operator process leads its own process group (`start_new_session`), so a kill reaches
    everything it started in that group; on Linux it also gets `PR_SET_PDEATHSIG = SIGKILL`, so it
    dies with the wrapper (the signal fires when the spawning thread exits: spawn only from the
    event loop's thread). Elsewhere the death signal is skipped.
  * A kill is SIGTERM to the group, then SIGKILL to the group after the grace period, always: the
    SIGKILL also ends stragglers that outlived the leader.
  * The environment of an operator is built from its allow-list only; the wrapper's own settings
    (the worker token above all) never reach it. It inherits no file descriptor but its three
    pipes: `close_fds`, and on Linux every descriptor from 3 up is also marked close-on-exec in
    the child before it runs the operator (`close_range`), because uvloop's spawn keeps
    descriptors that `close_fds` would have closed. An untrusted operator runs as the operator
    user when one is given.
  * An operator's stderr is always drained (a full pipe would block the child); only its last
    `cap` bytes are kept, for error messages.
  * Every process is disposed of (`dispose`): its pipes are read to the end or closed, so no
    transport outlives the task.
  * Exit is detected by polling `returncode`, not `Process.wait()`, which (from Python 3.12) also
    waits for the pipes, which a grandchild may hold open.
  * `start_operator` is the one way the runners (per-task and pooled) start an operator: its
    environment, scratch directory, user, process group, death signal, pipes, stderr tail and
    start count are set up there and nowhere else.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from taskplat.worker_wrapper.isolation import OperatorIdentity
from taskplat.worker_wrapper.observability import WrapperTelemetry
from taskplat.worker_wrapper.operators import PLATFORM_URL_VARS, OperatorSpec

_PR_SET_PDEATHSIG = 1
_SYS_CLOSE_RANGE = 436  # the same number on every Linux architecture
_CLOSE_RANGE_CLOEXEC = 4  # Linux 5.11+
_ALL_FDS = ctypes.c_uint(0xFFFFFFFF)
_POLL_SECONDS = 0.02
Process = asyncio.subprocess.Process


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def cloexec_all_supported() -> bool:
    """Whether this kernel marks a range of descriptors close-on-exec in one call (Linux 5.11+);
    probed on an empty range, so nothing changes."""
    libc = _libc()
    if libc is None:
        return False
    empty = ctypes.c_uint(0xFFFFFFFE)
    return int(libc.syscall(_SYS_CLOSE_RANGE, empty, empty, _CLOSE_RANGE_CLOEXEC)) == 0


def _child_setup(
    switch_to: OperatorIdentity | None = None,
) -> Callable[[], None] | None:
    """The child's set-up before exec: `switch_to`'s user (for a loop that cannot switch users
    itself), then the death signal (a change of user would reset it), then close-on-exec."""
    libc = _libc()
    if libc is None:
        return None
    try:  # resolved before fork, not in the child
        prctl = libc.prctl
        syscall = libc.syscall
    except AttributeError:
        return None
    parent = os.getpid()

    def preexec() -> None:
        if switch_to is not None:
            os.setgroups([])
            os.setgid(switch_to.gid)
            os.setuid(switch_to.uid)
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the wrapper died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
        # Nothing but the three pipes survives the exec, whichever loop spawned the child.
        syscall(_SYS_CLOSE_RANGE, 3, _ALL_FDS, _CLOSE_RANGE_CLOEXEC)

    return preexec


async def spawn_operator(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    line_limit: int,
    identity: OperatorIdentity | None = None,
    cwd: Path | None = None,
) -> Process:
    """Start an operator with pipes on stdin, stdout (lines up to `line_limit`) and stderr, and no
    other file descriptor of the wrapper; as `identity`'s user when given (asyncio's loop
    switches users itself; uvloop's cannot, so the child's set-up does)."""
    switches_users = isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)
    switch = identity.popen_kwargs() if identity is not None and switches_users else {}
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        close_fds=True,
        pass_fds=(),
        start_new_session=True,
        preexec_fn=_child_setup(None if switches_users else identity),
        limit=line_limit,
        **switch,
    )


def operator_env(
    name: str,
    spec: OperatorSpec,
    source: Mapping[str, str],
    task_vars: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The allow-listed variables present in `source`, the platform's service URLs
    (`PLATFORM_URL_VARS`, not secrets), plus the wrapper's `TASKPLAT_*` ones."""
    env = {key: source[key] for key in spec.env if key in source}
    env.update({key: source[key] for key in PLATFORM_URL_VARS if key in source})
    env["TASKPLAT_OPERATOR"] = name
    env["TASKPLAT_OPERATOR_MODE"] = spec.mode
    env.update(task_vars or {})
    return env


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def wait_exit(proc: Process, timeout: float) -> bool:
    """Wait up to `timeout` seconds for the process to exit; return whether it has."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while proc.returncode is None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_POLL_SECONDS)
    return True


async def kill_group(proc: Process, grace: float) -> None:
    """SIGTERM the process group, SIGKILL it after `grace` (or at once once the leader is gone)."""
    if proc.returncode is None:
        signal_group(proc.pid, signal.SIGTERM)
        await wait_exit(proc, grace)
    signal_group(proc.pid, signal.SIGKILL)
    await wait_exit(proc, 5.0)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class StderrTail:
    """Drains a stderr stream in the background, keeping its last `cap` bytes."""

    def __init__(self, stream: asyncio.StreamReader | None, cap: int) -> None:
        self._cap = cap
        self._buffer = bytearray()
        self._total = 0
        self._task = asyncio.create_task(self._pump(stream)) if stream is not None else None

    async def _pump(self, stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(64 * 1024)
            if not chunk:
                return
            self._total += len(chunk)
            if self._cap:
                self._buffer += chunk
                if len(self._buffer) > self._cap:
                    del self._buffer[: len(self._buffer) - self._cap]

    def mark(self) -> int:
        """A position: `text(since=mark)` shows only what was written after it."""
        return self._total

    def text(self, since: int = 0) -> str:
        size = min(len(self._buffer), self._total - since)
        if size <= 0:
            return ""
        return bytes(self._buffer[len(self._buffer) - size :]).decode("utf-8", "replace")

    async def settle(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the stream to end (after the process exited)."""
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task}, timeout=timeout)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def dispose(proc: Process, stderr: StderrTail, timeout: float = 2.0) -> None:
    """Kill what is left of the group and close the pipes: read stdout and stderr to their end
    (their writers are dead, so the rest is bounded) or, when an escaped process still holds
    them after `timeout`, close the transport."""
    signal_group(proc.pid, signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    if proc.stdout is not None:
        try:
            while await asyncio.wait_for(proc.stdout.read(64 * 1024), deadline - loop.time()):
                pass
        except (TimeoutError, ValueError, OSError):
            pass
    await stderr.settle(max(0.0, deadline - loop.time()))
    await stderr.close()
    transport = getattr(proc, "_transport", None)  # no public close; ends a pipe still held
    if transport is not None and not transport.is_closing():
        transport.close()


@dataclass(eq=False)
class OperatorProcess:
    """A started operator process and the drained tail of its stderr."""

    proc: Process
    stderr: StderrTail

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


async def start_operator(
    name: str,
    spec: OperatorSpec,
    environ: Mapping[str, str],
    *,
    line_limit: int,
    stderr_tail_bytes: int,
    telemetry: WrapperTelemetry,
    task_vars: Mapping[str, str] | None = None,
    identity: OperatorIdentity | None = None,
    scratch: Path | None = None,
) -> OperatorProcess:
    """Start operator `name` as `spawn_operator` does, with `operator_env`'s environment (plus
    `task_vars`); with a `scratch` directory, that directory is its cwd, HOME and TMPDIR. Counts
    the start; its stderr is drained into a tail of `stderr_tail_bytes`. Raises OSError when the
    process cannot start."""
    env = operator_env(name, spec, environ, task_vars)
    if scratch is not None:
        env.update(HOME=str(scratch), TMPDIR=str(scratch), TASKPLAT_SCRATCH_DIR=str(scratch))
    proc = await spawn_operator(
        spec.argv(), env, line_limit=line_limit, identity=identity, cwd=scratch
    )
    telemetry.operator_started(name, spec.mode)
    return OperatorProcess(proc, StderrTail(proc.stderr, stderr_tail_bytes))


def _closed_under(stdin: asyncio.StreamWriter, exc: Exception) -> bool:
    """Whether `exc`, raised writing to `stdin`, means the operator closed the pipe (or exited)."""
    if isinstance(exc, BrokenPipeError | ConnectionResetError):
        return True
    return isinstance(exc, RuntimeError) and stdin.is_closing()  # uvloop: closed under the write


def offer_input(proc: Process, data: bytes) -> bool:
    """Hand `data` to the operator's stdin now (the pipe takes what fits at once, the rest is
    buffered); False when the operator closed it (or exited)."""
    stdin = proc.stdin
    if stdin is None or stdin.is_closing():
        return False
    try:
        stdin.write(data)
    except (OSError, RuntimeError) as exc:
        if _closed_under(stdin, exc):
            return False
        raise
    return True


async def drain_input(proc: Process, *, close: bool) -> bool:
    """Wait until what was offered left the buffer (closing stdin after it with `close`); False
    when the operator closed it (or exited)."""
    stdin = proc.stdin
    if stdin is None:
        return False
    try:
        await stdin.drain()
        if close:
            stdin.close()
    except (OSError, RuntimeError) as exc:
        if _closed_under(stdin, exc):
            return False
        raise
    return True


async def write_input(proc: Process, data: bytes, *, close: bool) -> bool:
    """Write `data` to the operator's stdin; False when the operator closed it (or exited)."""
    return offer_input(proc, data) and await drain_input(proc, close=close)
