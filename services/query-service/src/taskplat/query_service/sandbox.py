"""The sandbox side: `python -I -m taskplat.query_service.sandbox CONTROL_FD LIMITS_JSON`.

(`--unguarded` after them skips the guard: only the tests of the lockdown layer on its own start
a fork server so; the service's pool never does.)

This process is started by the service (`pool.py`) with an environment of its own (no DSN, key,
token or AWS variable of the service's) and no descriptor but its control socket. It is a fork
server: it imports DuckDB and pyarrow once, and forks one child per sandbox the service asks for
(a Unix socket passed over the control socket, `SCM_RIGHTS`), answering the child's pid; it reaps
its children as they exit.

Invariants of a child (one sandbox):
  * Its DuckDB is its own copy (by `fork`) of an in-memory database the fork server opened on one
    thread and restricted (no directory, no external access: `engine.restrict`), and never queried
    nor gave data to. Its configuration is locked (`engine.lock`) before it reads a byte from the
    service: once in the fork server when a query runs on one thread (so no sandbox pays for it),
    else by each sandbox first thing, as DuckDB starts its worker threads there and a fork keeps
    only the forking thread. It then decides the
    statement with the guard (on that DuckDB, holding no data: DuckDB's parser never sees untrusted
    SQL in the service) and answers the views it reads, or the refusal; given the inputs (a JSON
    header, then one Arrow IPC stream per input), it registers each under its view names, runs the
    one statement, writes one answer (a JSON header, then the body) and exits. It serves one query,
    never two.
  * It holds no secret, no database connection and no AWS credential: the service reads the
    inputs and hands them over as Arrow. Whatever runs inside it can reach only those tables,
    and no host: the fork server installs `seccomp.deny_network()` first thing, inherited by
    every sandbox (no socket but `AF_UNIX`).
  * Its answer is data for the service (JSON and bytes, never pickled objects).
  * The fork server does not import numpy (pyarrow would import it when it is installed; nothing
    here uses it): its memory is what every fork copies the page tables of and every sandbox tears
    down on exit, and numpy with its BLAS is ~6 MB of it (docs/performance.md, W6).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # the fork server only; the service imports this module too
    sys.modules["numpy"] = None  # type: ignore[assignment]  # an import of it fails

import json
import os
import resource
import signal
import socket
from dataclasses import replace
from typing import Any

import duckdb
import pyarrow as pa

from taskplat.query_service import engine, frames, guard, seccomp

READY = b'{"ready":true}'
UNGUARDED = "--unguarded"  # tests of the lockdown alone; the service never passes it
MAX_REQUEST = 1 << 40  # the service's own frames: it bounds the inputs it reads itself


def _warm_up() -> None:
    """Import what DuckDB imports lazily on its first Arrow scan, and read the catalog names the
    guard needs, once, before any fork (on a single-threaded DuckDB, closed before forking)."""
    conn = duckdb.connect(":memory:", config={"threads": 1})
    try:
        guard.system_names(conn)  # read once here (no view yet), inherited by every sandbox
        conn.register("warm", pa.table({"x": [1]}))
        conn.sql("SELECT count(*), now()::TIMESTAMPTZ FROM warm").fetchall()  # and pytz
    finally:
        conn.close()


def _failure(code: str, message: str) -> bytes:
    return json.dumps({"ok": False, "error": code, "message": message[:1000]}).encode()


def serve(
    sock: socket.socket, limits: engine.Limits, conn: duckdb.DuckDBPyConnection, guarded: bool
) -> None:
    """One sandbox: say ready on `conn` (this process's copy of a locked, never-used database),
    decide one statement (the guard; unguarded only in tests of the lockdown alone), then, given
    its inputs, answer it."""
    frames.send(sock, READY)
    asked: dict[str, Any] = json.loads(frames.receive(sock, MAX_REQUEST))
    sql, views = str(asked["sql"]), [str(v) for v in asked["views"]]
    try:
        checked = guard.check(sql, views, conn) if guarded else guard.Checked(sql, frozenset(views))
    except (guard.Refused, guard.InvalidSql) as exc:
        frames.send(sock, _failure(exc.code, exc.message))
        return
    frames.send(sock, json.dumps({"ok": True, "views": sorted(checked.views)}).encode())
    request: dict[str, Any] = json.loads(frames.receive(sock, MAX_REQUEST))
    tables = [
        pa.ipc.open_stream(frames.receive(sock, MAX_REQUEST)).read_all()
        for _ in range(int(request["inputs"]))
    ]
    for name, index in request["views"]:
        conn.register(str(name), tables[int(index)])
    run_limits = replace(limits, max_rows=int(request["max_rows"]))
    try:
        answer = engine.run(
            conn,
            checked.sql,
            request.get("params"),
            run_limits,
            run_limits.max_rows,
            request["format"],
        )
    except engine.QueryFailed as exc:
        frames.send(sock, _failure(exc.code, exc.message))
        return
    header = {
        "ok": True,
        "media_type": answer.media_type,
        "row_count": answer.row_count,
        "truncated": answer.truncated,
        "elapsed_ms": answer.elapsed_ms,
    }
    frames.send_many(sock, [json.dumps(header).encode(), answer.body])


def _child(fd: int, limits: engine.Limits, conn: duckdb.DuckDBPyConnection, guarded: bool) -> None:
    sock = socket.socket(fileno=fd)
    try:
        serve(sock, limits, conn, guarded)
    except frames.FrameError:
        pass  # the service went away or gave up on this sandbox
    except Exception as exc:  # any failure is answered, never a traceback
        try:
            frames.send(sock, _failure("sandbox_failed", type(exc).__name__))
        except OSError:
            pass


def _reap(signum: int, frame: object) -> None:
    """Wait for every child that has exited (so their CPU time is counted in this process's
    `cutime`/`cstime`, as for any reaped child)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    control = socket.socket(fileno=int(argv[1]))
    limits = engine.Limits(**json.loads(argv[2]))
    guarded = argv[3:] != [UNGUARDED]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    seccomp.deny_network()  # no socket but AF_UNIX, here and in every sandbox
    _warm_up()
    # Restricted, never queried: each child gets its copy. Locked here when a query runs on one
    # thread; else each child starts its threads and locks it (a fork keeps one thread).
    template = engine.open_database(limits)
    engine.restrict(template)
    locked_here = limits.threads == 1
    if locked_here:
        engine.lock(template, limits)
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 16, 1)
        except OSError:
            return 0
        if not message:
            for fd in fds:
                os.close(fd)
            return 0
        if not fds:
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                if not locked_here:
                    engine.lock(template, limits)  # before a byte from the service is read
                _child(fds[0], limits, template, guarded)
            except BaseException:  # a child never returns into the loop
                code = 1
            finally:
                os._exit(code)
        os.close(fds[0])
        control.sendall(pid.to_bytes(4, "big"))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
