"""pytest plugin: slow preparations (the runtimes' builds, the moto fallback's venv, a linter run)
start in the background as the session begins, so the tests that need them wait on that one run
instead of doing it inline while the machine's other core idles.

Register it with ``pytest_plugins`` in the root conftest.py, next to ``taskplat.testkit.fixtures``.

Invariants:
- A preparation is a named function registered with `register(name, fn)` (by the module or
  conftest.py that owns it); a test declares that it needs one with
  ``@pytest.mark.prebuild(name, ...)`` on the test, its class or its module.
- After collection, the preparations that a selected test declares run in one background thread,
  one after another in registration order; a session that selects none of them (or only
  collects) starts nothing.
  Their subprocesses (started with `run`) run at a low CPU priority, so the tests running beside
  them keep the CPU they need.
- `result(name, timeout)` gives the preparation's value or raises what it raised (pytest.skip and
  pytest.fail included), after waiting at most ``timeout`` seconds; a preparation that was not
  started in the background runs inline in the caller. Each runs at most once per test process.
- At session end every subprocess a preparation still runs is killed (its whole process group).
- The workers of one pytest-xdist run share each preparation: the first to take the lock
  `.cache/prebuild/<name>.lock` (under the rootdir) runs it and keeps its value there for the run
  (`<name>.<run id>.pickle`); the others wait for the lock and take that value, so no worker
  rebuilds what another one's tests are using. A preparation that raised is run again by the next.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

__all__ = ["pytest_collection_finish", "pytest_configure", "pytest_sessionfinish"]

BACKGROUND_NICENESS = 10
_THREAD_NAME = "taskplat-prebuild"

_lock = threading.Lock()
_jobs: dict[str, Callable[[], Any]] = {}
_futures: dict[str, Future[Any]] = {}
_children: set[subprocess.Popen[str]] = set()
_stopping = threading.Event()
_lock_dir: list[Path] = []  # set by pytest_configure: where the cross-process locks live


def register(name: str, fn: Callable[[], Any]) -> None:
    """Make ``fn`` the preparation called ``name`` (registering it again keeps the first)."""
    with _lock:
        _jobs.setdefault(name, fn)


def result(name: str, timeout: float) -> Any:
    """The value of the preparation ``name``: waits for the background run, or runs it here."""
    with _lock:
        future = _futures.get(name)
        owner = future is None
        if future is None:
            future = _futures[name] = Future()
            fn = _jobs[name]
    if owner:
        _complete(future, name, fn)
    try:
        return future.result(timeout=timeout)
    except TimeoutError:
        pytest.fail(f"the preparation {name!r} did not finish within {timeout:.0f} s")


def run(
    argv: Sequence[str], cwd: Path, what: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; at low priority in the background thread; fail the caller on a non-zero exit
    (the output's tails in the message) or after ``timeout`` seconds."""
    with _lock:  # pytest_sessionfinish kills every child started before it, and no later one starts
        if _stopping.is_set():
            pytest.fail(f"{what}: not started, the test session has ended")
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # one process group: killed whole at session end
        )
        _children.add(process)
    try:
        if threading.current_thread().name == _THREAD_NAME:
            try:
                os.setpriority(os.PRIO_PGRP, process.pid, BACKGROUND_NICENESS)
            except OSError:
                pass  # it already exited, or the platform refuses: it runs at normal priority
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process)
            process.communicate()
            pytest.fail(f"{what} did not finish within {timeout:.0f} s")
    finally:
        with _lock:
            _children.discard(process)
    if process.returncode != 0:
        stopped = " (stopped at session end)" if _stopping.is_set() else ""
        tails = f"{stdout[-4000:]}\n{stderr[-4000:]}"
        pytest.fail(f"{what} failed ({process.returncode}){stopped}:\n{tails}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _complete(future: Future[Any], name: str, fn: Callable[[], Any]) -> None:
    try:
        value = _shared_by_the_run(name, fn)
    except BaseException as exc:  # pytest's skip and fail outcomes travel too
        future.set_exception(exc)
    else:
        future.set_result(value)


def _background(names: list[str]) -> None:
    for name in names:
        if _stopping.is_set():
            return
        with _lock:
            if name in _futures:
                continue  # a test already ran it inline
            future = _futures[name] = Future()
            fn = _jobs[name]
        _complete(future, name, fn)


def _shared_by_the_run(name: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, run once for all the workers of this pytest-xdist run (see the invariants)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not _lock_dir or run_id is None:
        return fn()
    directory = _lock_dir[0]
    directory.mkdir(parents=True, exist_ok=True)
    kept = directory / f"{name}.{run_id}.pickle"
    # The kernel drops the lock when its holder exits, however it exits.
    with open(directory / f"{name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if kept.exists():
            return pickle.loads(kept.read_bytes())
        for earlier in directory.glob(f"{name}.*.pickle"):
            earlier.unlink(missing_ok=True)  # an earlier run's
        value = fn()
        kept.write_bytes(pickle.dumps(value))
        return value


def _kill(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def pytest_configure(config: pytest.Config) -> None:
    _lock_dir[:] = [config.rootpath / ".cache" / "prebuild"]
    config.addinivalue_line(
        "markers",
        "prebuild(*names): the test needs these preparations (taskplat.testkit.prebuild); "
        "they start in the background after collection",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    wanted: set[str] = set()
    for item in session.items:
        for marker in item.iter_markers("prebuild"):
            wanted.update(marker.args)
    unknown = sorted(wanted - set(_jobs))
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.prebuild names no registered preparation: {unknown}")
    names = [name for name in _jobs if name in wanted]
    if names:
        threading.Thread(target=_background, args=(names,), name=_THREAD_NAME, daemon=True).start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    with _lock:
        _stopping.set()
        children = list(_children)
    for process in children:
        _kill(process)
