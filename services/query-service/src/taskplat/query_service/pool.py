"""The service's side of its sandboxes: a fork server with a scrubbed environment, and a small pool
of sandboxes prepared ahead.

Invariants:
  * The fork server (`sandbox.py`) is started with `SANDBOX_ENV` only (no variable of the
    service's: no DSN, no key, no token, no AWS variable), a private empty directory as its
    home, cwd and TMPDIR, Python's isolated mode, and no descriptor but its control socket. Every
    sandbox is its child and inherits only that.
  * A sandbox is prepared ahead (DuckDB open and locked down, `READY` said) by a background
    thread that keeps `size` of them ready; `take` hands out a ready one, or prepares one on the
    spot when none is left. A sandbox serves one query and is closed, never handed out again.
  * The statement is decided by the guard inside the sandbox (`check`), before any input is read;
    the views it answers must be among those it was given (a sandbox may name no more than its
    token's inputs).
  * Reading a sandbox's answer is bounded in time (the run time limit plus `GRACE_SECONDS` for the
    answer to arrive) and size (the answer byte limit plus room for columns); past the time it
    is killed (`QueryTimeout`): this deadline is the query's time limit, the sandbox keeps none
    of its own. A malformed or oversized answer kills it too (`SandboxFailed`). Its answer is
    read as JSON and bytes only.
  * If the fork server dies it is started again on the next preparation.
  * Before the first sandbox exists the service's process is made non-dumpable
    (`PR_SET_DUMPABLE` 0): a sandbox, a process of the same user, cannot read its
    `/proc/<pid>/environ`, `mem` or `fd/`, nor attach to it.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import ValidationError

from taskplat.common.contracts.base import Contract
from taskplat.common.errors import TaskplatError
from taskplat.common.logging import get_logger
from taskplat.query_service import engine, frames, guard
from taskplat.query_service.sandbox import READY, UNGUARDED

_PR_SET_DUMPABLE, _PR_GET_DUMPABLE = 4, 3
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
START_SECONDS = 60.0
GRACE_SECONDS = 0.5  # past the time limit, for an answer on its way
HEADER_LIMIT = 64 * 1024
Media = Literal[
    "application/json", "text/csv; charset=utf-8", "application/vnd.apache.arrow.stream"
]


class SandboxFailed(TaskplatError):
    """The sandbox died or answered something that is not an answer."""

    code = "sandbox_failed"


class SandboxAnswer(Contract):
    ok: bool
    views: list[str] | None = None
    media_type: Media | None = None
    row_count: int | None = None
    truncated: bool | None = None
    elapsed_ms: float | None = None
    error: str | None = None
    message: str | None = None


def make_non_dumpable() -> bool:
    """Set `PR_SET_DUMPABLE` 0 (Linux); whether the process is now non-dumpable."""
    if not sys.platform.startswith("linux"):
        return False
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    return bool(prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


def network_filtered(pid: int) -> bool:
    """Whether `pid` runs under a seccomp filter with `no_new_privs` (`/proc/<pid>/status`)."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
    except (OSError, ValueError):
        return False
    return fields.get("Seccomp", "").strip() == "2" and fields.get("NoNewPrivs", "").strip() == "1"


def arrow_stream(table: pa.Table) -> memoryview:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return memoryview(sink.getvalue())


class Sandbox:
    """One prepared sandbox: a locked-down DuckDB in a child process, for one query."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self._pidfd: int | None = None

    def hold(self) -> None:
        """Take a pidfd of the sandbox once it said it is ready (it is then alive, waiting for
        its request): a kill through it can never reach a process that reused the pid."""
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def check(self, sql: str, views: Iterable[str], limits: engine.Limits) -> frozenset[str]:
        """The guard's decision, made in the sandbox: the views `sql` reads (a subset of
        `views`), or `Refused`/`InvalidSql`. A refusal closes the sandbox."""
        allowed = sorted(views)
        deadline = time.monotonic() + limits.timeout_seconds + GRACE_SECONDS
        try:
            frames.send(self._sock, json.dumps({"sql": sql, "views": allowed}).encode())
            head = self._answer_header(deadline)
        except frames.FrameTimeout:
            self.kill()
            self.close()
            raise engine.QueryTimeout(f"the query ran past {limits.timeout_seconds:g} s") from None
        except (frames.FrameError, OSError):
            self.kill()
            self.close()
            raise SandboxFailed("the query's sandbox failed before answering") from None
        if not head.ok:
            self.close()
            raise _failure(head)
        read = frozenset(head.views or ())
        if not read <= set(allowed):
            self.kill()
            self.close()
            raise SandboxFailed("the query's sandbox named views it was not given")
        return read

    def run(
        self,
        request: dict[str, Any],
        tables: list[pa.Table],
        limits: engine.Limits,
    ) -> engine.Answer:
        """Hand over the checked statement's inputs; the sandbox's answer. Closes the sandbox."""
        deadline = time.monotonic() + limits.timeout_seconds + GRACE_SECONDS
        try:
            header = json.dumps({**request, "inputs": len(tables)}).encode()
            frames.send_many(self._sock, [header, *(arrow_stream(t) for t in tables)])
            head = self._answer_header(deadline)
            if not head.ok:
                raise _failure(head)
            if head.media_type is None:
                self.kill()
                raise SandboxFailed("the query's sandbox answered no media type")
            body = frames.receive(self._sock, limits.max_bytes + 4 * HEADER_LIMIT, deadline)
        except frames.FrameTimeout:
            self.kill()
            raise engine.QueryTimeout(f"the query ran past {limits.timeout_seconds:g} s") from None
        except (frames.FrameError, OSError):
            self.kill()
            raise SandboxFailed("the query's sandbox failed before answering") from None
        finally:
            self.close()
        return engine.Answer(
            body,
            head.media_type or "",
            head.row_count or 0,
            bool(head.truncated),
            head.elapsed_ms or 0.0,
        )

    def _answer_header(self, deadline: float) -> SandboxAnswer:
        raw = frames.receive(self._sock, HEADER_LIMIT, deadline)
        try:
            head = SandboxAnswer.model_validate_json(raw)
        except ValidationError:
            self.kill()
            raise SandboxFailed("the query's sandbox answered something unreadable") from None
        return head

    def kill(self) -> None:
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self._sock.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _failure(head: SandboxAnswer) -> TaskplatError:
    message = head.message or "the query failed"
    if head.error == guard.Refused.code:
        return guard.Refused(message)
    if head.error == guard.InvalidSql.code:
        return guard.InvalidSql(message)
    if head.error == engine.QueryTimeout.code:
        return engine.QueryTimeout(message)
    if head.error == engine.QueryFailed.code:
        return engine.QueryFailed(message)
    return SandboxFailed("the query's sandbox failed")


class SandboxPool:
    def __init__(self, size: int, limits: engine.Limits, *, guarded: bool = True) -> None:
        """`guarded=False` only for tests of the lockdown layer alone (no guard in the
        sandboxes); the service always runs guarded."""
        self._size = size
        self._limits = limits
        self._guarded = guarded
        self._filter_noted = False
        self._ready: deque[Sandbox] = deque()
        self._changed = threading.Condition()
        self._control_lock = threading.Lock()
        self._control: socket.socket | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._home: str | None = None
        self._stopping = False
        self._refill = threading.Thread(target=self._refill_loop, name="sandbox-pool", daemon=True)

    def start(self) -> None:
        make_non_dumpable()
        self._refill.start()

    def ready(self) -> int:
        with self._changed:
            return len(self._ready)

    def take(self) -> Sandbox:
        """A prepared sandbox of its own for one query."""
        with self._changed:
            sandbox = self._ready.popleft() if self._ready else None
            self._changed.notify_all()
        return sandbox or self.prepare()

    def prepare(self) -> Sandbox:
        """A new sandbox, locked down and ready (waits for the fork server if it is starting)."""
        deadline = time.monotonic() + START_SECONDS
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._control_lock:
                control = self._fork_server()
                try:
                    socket.send_fds(control, [b"F"], [theirs.fileno()])
                    pid = int.from_bytes(frames.read_exactly(control, 4, deadline), "big")
                except (OSError, frames.FrameError):
                    self._stop_server()
                    raise
            theirs.close()
            sandbox = Sandbox(pid, ours)
            if frames.receive(ours, len(READY), deadline) != READY:
                sandbox.kill()
                raise SandboxFailed("a sandbox did not get ready")
            sandbox.hold()
            self._note_filter(pid)
            return sandbox
        except BaseException:
            ours.close()
            theirs.close()
            raise

    def _note_filter(self, pid: int) -> None:
        """Log once if a sandbox runs without its network filter (an unknown platform)."""
        if self._filter_noted:
            return
        self._filter_noted = True
        if not network_filtered(pid):
            get_logger().warning("sandbox_network_not_filtered", pid=pid)

    def close(self) -> None:
        with self._changed:
            self._stopping = True
            ready, self._ready = list(self._ready), deque()
            self._changed.notify_all()
        for sandbox in ready:
            sandbox.close()
        with self._control_lock:
            self._stop_server()

    def _refill_loop(self) -> None:
        while True:
            with self._changed:
                while not self._stopping and len(self._ready) >= self._size:
                    self._changed.wait()
                if self._stopping:
                    return
            try:
                sandbox = self.prepare()
            except Exception as exc:  # logged, tried again
                get_logger().warning("sandbox_prepare_failed", error=type(exc).__name__)
                with self._changed:
                    self._changed.wait(1.0)
                continue
            with self._changed:
                if self._stopping:
                    sandbox.close()
                    return
                self._ready.append(sandbox)

    def _fork_server(self) -> socket.socket:
        """The control socket of a running fork server (started if none is). Under the lock."""
        if self._control is not None and self._server is not None and self._server.poll() is None:
            return self._control
        self._stop_server()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._home = tempfile.mkdtemp(prefix="taskplat-sandbox-")
        env = {**SANDBOX_ENV, "HOME": self._home, "TMPDIR": self._home}
        command = [
            sys.executable,
            "-I",
            "-m",
            "taskplat.query_service.sandbox",
            str(theirs.fileno()),
            json.dumps(asdict(self._limits)),
            *([] if self._guarded else [UNGUARDED]),
        ]
        self._server = subprocess.Popen(
            command,
            env=env,
            cwd=self._home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            close_fds=True,
        )
        theirs.close()
        self._control = ours
        return ours

    def _stop_server(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._server is not None:
            try:
                self._server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server = None
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    @property
    def server_pid(self) -> int | None:
        return self._server.pid if self._server is not None else None
