"""A small process manager: runs services, restarts the ones that die (as ECS would), stops them.

Invariants:
- Every child is spawned by the supervisor's own thread, which lives until `close()` has stopped
  every child: with PR_SET_PDEATHSIG tied to that thread, a supervisor that crashes (even with
  SIGKILL) leaves no service behind.
- A managed service that exits for any reason, signal or exit code, is logged with its exit
  status and started again after a backoff: `restart_backoff * 2**n` (capped), where n counts the
  exits in a row that came less than `HEALTHY_SECONDS` after a start.
- `remove()` and `close()` stop services gracefully: SIGTERM to the process group, SIGKILL at the
  service's stop timeout; a service being stopped is never restarted. `close()` stops every
  remaining service in parallel.
- Each start of a service is one "generation" (0, 1, ...); its output is appended to
  `<log_dir>/<name>.log`, so a restarted service keeps one log.
- Public methods are thread-safe: they hand work to the supervisor thread and wait for it.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.procs import Child, group_alive, signal_group, spawn

log = logging.getLogger("taskplat.devstack.stack")

HEALTHY_SECONDS = 10.0
_TICK_SECONDS = 0.05
_CALL_TIMEOUT_SECONDS = 120.0
T = TypeVar("T")


@dataclass(frozen=True)
class ServiceSpec:
    """How to run one service. `generation_env` names a variable set to `<name>.<generation>` at
    each start (the worker wrappers' `TASKPLAT_WORKER_ID`)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path | None = None
    stop_timeout: float = 20.0
    generation_env: str | None = None


@dataclass
class _Managed:
    spec: ServiceSpec
    child: Child | None = None
    generation: int = -1
    started_at: float = 0.0
    quick_exits: int = 0
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class Supervisor:
    """Runs `ServiceSpec`s as child processes and keeps them running until removed or closed."""

    def __init__(
        self,
        log_dir: Path,
        *,
        restart_backoff: float = 0.5,
        restart_backoff_max: float = 10.0,
        on_spawn: Callable[[str, Path], None] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.restart_backoff = restart_backoff
        self.restart_backoff_max = restart_backoff_max
        self._on_spawn = on_spawn
        self._services: dict[str, _Managed] = {}
        self._commands: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = (
            queue.SimpleQueue()
        )
        self._closed = threading.Event()
        self._lock = threading.Lock()  # guards reads of _services from other threads
        self._thread = threading.Thread(target=self._run, name="stack-supervisor", daemon=True)

    # -- public API (any thread) ------------------------------------------------------------

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def add(self, spec: ServiceSpec) -> int:
        """Start a new service; return its pid."""
        return self._call(lambda: self._add(spec))

    def remove(self, name: str, *, timeout: float | None = None) -> int | None:
        """Stop a service gracefully and forget it; return its exit code (None if not running)."""
        return self._call(lambda: self._remove(name, timeout))

    def restart(self, name: str) -> int:
        """Stop a service gracefully and start it again at once; return the new pid."""
        return self._call(lambda: self._restart(name))

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send `sig` to the service's main process (not its group): a crash, as the OS would
        cause it. The supervisor then restarts it as it would after any exit. Return the pid.

        The signal takes effect asynchronously: the process may still be listed by `pids()` for a
        moment. To kill the restarted process, wait for a pid other than the one returned."""
        return self._call(lambda: self._kill(name, sig))

    def pids(self) -> dict[str, int]:
        with self._lock:
            return {
                name: managed.child.pid
                for name, managed in self._services.items()
                if managed.child is not None and managed.child.alive()
            }

    def names(self) -> list[str]:
        with self._lock:
            return list(self._services)

    def generation(self, name: str) -> int:
        with self._lock:
            return self._managed(name).generation

    def exits(self, name: str) -> list[int]:
        """Exit statuses of the service's earlier generations (negative: killed by a signal)."""
        with self._lock:
            return list(self._managed(name).exits)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def close(self, *, names_first: list[str] | None = None) -> None:
        """Stop every service (those in `names_first` before the others) and end the thread."""
        if not self._thread.is_alive():
            return
        first = list(names_first or [])
        self._call(lambda: self._close(first), timeout=None)
        self._thread.join(timeout=10)

    # -- the supervisor thread --------------------------------------------------------------

    def _call(self, fn: Callable[[], T], timeout: float | None = _CALL_TIMEOUT_SECONDS) -> T:
        if not self._thread.is_alive() or self._closed.is_set():
            raise DevstackError("the stack's supervisor is not running")
        future: Future[object] = Future()
        self._commands.put((fn, future))
        return future.result(timeout=timeout)  # type: ignore[return-value]

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                fn, future = self._commands.get(timeout=_TICK_SECONDS)
            except queue.Empty:
                pass
            else:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:
                        future.set_exception(exc)
            try:
                self._watch()
            except Exception:  # a bug here must not end supervision; log it and go on
                log.exception("supervisor: error while watching the services")
        while True:  # calls that arrived while closing
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                break
            future.set_exception(DevstackError("the stack's supervisor has stopped"))

    def _managed(self, name: str) -> _Managed:
        try:
            return self._services[name]
        except KeyError:
            raise DevstackError(f"no service named {name!r} in this stack") from None

    def _spawn(self, managed: _Managed) -> int:
        spec = managed.spec
        env = dict(spec.env)
        generation = managed.generation + 1
        if spec.generation_env:
            env[spec.generation_env] = f"{spec.name}.{generation}"
        log_path = self.log_path(spec.name)
        if self._on_spawn is not None:
            self._on_spawn(spec.name, log_path)
        child = spawn(
            spec.name,
            spec.argv,
            log_path=log_path,
            env=env,
            cwd=spec.cwd,
            die_with_parent=True,
            death_signal=signal.SIGTERM,
        )
        with self._lock:
            managed.child = child
            managed.generation = generation
            managed.started_at = time.monotonic()
            managed.restart_at = None
        return child.pid

    def _add(self, spec: ServiceSpec) -> int:
        if spec.name in self._services:
            raise DevstackError(f"a service named {spec.name!r} already runs")
        managed = _Managed(spec)
        with self._lock:
            self._services[spec.name] = managed
        try:
            return self._spawn(managed)
        except BaseException:
            with self._lock:
                del self._services[spec.name]
            raise

    def _remove(self, name: str, timeout: float | None) -> int | None:
        managed = self._managed(name)
        with self._lock:
            del self._services[name]
        codes = self._stop([managed], timeout)
        return codes.get(name)

    def _restart(self, name: str) -> int:
        managed = self._managed(name)
        self._stop([managed], None)
        log.info("%s: restarting (requested)", name)
        return self._spawn(managed)

    def _kill(self, name: str, sig: int) -> int:
        managed = self._managed(name)
        if managed.child is None or not managed.child.alive():
            raise DevstackError(f"{name} is not running (it is being restarted)")
        os.kill(managed.child.pid, sig)
        return managed.child.pid

    def _stop(self, items: list[_Managed], timeout: float | None) -> dict[str, int]:
        """Stop the given services in parallel; return their exit codes."""
        running = [m for m in items if m.child is not None]
        now = time.monotonic()
        deadlines: dict[str, float] = {}
        for managed in running:
            assert managed.child is not None
            if managed.child.alive():
                signal_group(managed.child.pid, signal.SIGTERM)
            limit = managed.spec.stop_timeout if timeout is None else timeout
            deadlines[managed.spec.name] = now + limit
        codes: dict[str, int] = {}
        for managed in running:
            child = managed.child
            assert child is not None
            if not child.wait(deadlines[managed.spec.name] - time.monotonic()):
                log.warning("%s: still running after its stop timeout; killing it", child.name)
            if child.alive() or group_alive(child.pid):
                child.stop_group(sig=signal.SIGKILL, timeout=5.0)
            codes[managed.spec.name] = child.popen.returncode
            with self._lock:
                managed.child = None
                managed.restart_at = None
        return codes

    def _close(self, first: list[str]) -> None:
        try:
            ordered = [self._services[n] for n in first if n in self._services]
            self._stop(ordered, None)
            self._stop(list(self._services.values()), None)
            with self._lock:
                self._services.clear()
        finally:
            self._closed.set()

    def _watch(self) -> None:
        now = time.monotonic()
        for managed in list(self._services.values()):
            child = managed.child
            if child is not None and not child.alive():
                code = child.popen.returncode
                # Stragglers of its group (a uvicorn worker, say) go with it.
                if group_alive(child.pid):
                    child.stop_group(sig=signal.SIGKILL, timeout=2.0)
                ran = now - managed.started_at
                managed.quick_exits = 0 if ran >= HEALTHY_SECONDS else managed.quick_exits + 1
                delay = min(
                    self.restart_backoff_max,
                    self.restart_backoff * 2 ** max(managed.quick_exits - 1, 0),
                )
                log.warning(
                    "%s exited (%s) after %.1fs; restarting in %.1fs",
                    child.name,
                    describe_exit(code),
                    ran,
                    delay,
                )
                with self._lock:
                    managed.exits.append(code)
                    managed.child = None
                    managed.restart_at = now + delay
            elif child is None and managed.restart_at is not None and now >= managed.restart_at:
                try:
                    pid = self._spawn(managed)
                except DevstackError as exc:
                    log.error("%s: cannot restart: %s", managed.spec.name, exc)
                    managed.restart_at = now + self.restart_backoff_max
                else:
                    log.info(
                        "%s: restarted (generation %d, pid %d)",
                        managed.spec.name,
                        managed.generation,
                        pid,
                    )
