"""The services of a stack and how each one is run: modules, environments, stop timeouts.

Invariants:
- Every service runs as `<this interpreter> -m <module>`, so `make up` runs the code of the
  workspace it was started from.
- Worker wrappers never get the database URL nor the API keys (docs/security.md:
  workers hold no database credentials); they get `TASKPLAT_WORKER_QUEUE` and, at each start, a
  fresh `TASKPLAT_WORKER_ID` (`<service>.<generation>`, set by the supervisor).
- A worker wrapper's stop timeout covers its whole drain as configured (drain, kill grace, the
  reports of stopped tasks and the long-poll in flight), so a graceful stop is never cut short.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.stack.supervisor import ServiceSpec

SERVICES: dict[str, str] = {
    "dispatcher": "taskplat.dispatcher",
    "relay": "taskplat.outbox_relay",
    "scheduler": "taskplat.scheduler",
    "reaper": "taskplat.reaper",
    "sink": "taskplat.sink",
}
WORKER_MODULE = "taskplat.worker_wrapper"
WORKER_GROUP = "worker"  # key of `service_env` that applies to every worker wrapper
_NOT_FOR_WORKERS = (
    "DATABASE_URL",
    "TASKPLAT_API_KEYS",
    "TASKPLAT_ATTEMPT_TOKEN_KEYS",
    "TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID",
    "TASKPLAT_CAPABILITY_TOKEN_KEYS",
    "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID",
)
_STOP_TIMEOUTS = {
    "dispatcher": 25.0,
    "relay": 10.0,
    "scheduler": 10.0,
    "reaper": 10.0,
    "sink": 10.0,
}
# The setting of each process's /metrics and /healthz port (the dispatcher serves them itself).
OPS_PORT_SETTINGS = {
    "relay": "TASKPLAT_RELAY_OPS_PORT",
    "scheduler": "TASKPLAT_SCHEDULER_OPS_PORT",
    "reaper": "TASKPLAT_REAPER_OPS_PORT",
    "sink": "TASKPLAT_SINK_OPS_PORT",
    WORKER_GROUP: "TASKPLAT_WORKER_OPS_PORT",
}


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:`port` now (with SO_REUSEADDR, as uvicorn
    binds: connections of an earlier server still in TIME_WAIT do not make it taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def require_installed(modules: list[str]) -> None:
    """Refuse to start when a service is not installed here (it would only crash-loop)."""
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise DevstackError(
            f"not installed in {sys.executable}: {', '.join(missing)}; run `make venv` "
            "(uv sync --all-packages) first"
        )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name, default))
    except ValueError:
        return default


def service_spec(
    name: str,
    module: str,
    env: Mapping[str, str],
    overrides: Mapping[str, str],
    *,
    cwd: Path,
) -> ServiceSpec:
    return ServiceSpec(
        name=name,
        argv=(sys.executable, "-m", module),
        env={**env, **overrides},
        cwd=cwd,
        stop_timeout=_STOP_TIMEOUTS.get(name, 10.0),
    )


def worker_spec(
    name: str,
    queue: str,
    env: Mapping[str, str],
    overrides: Mapping[str, str],
    *,
    cwd: Path,
) -> ServiceSpec:
    worker_env = {k: v for k, v in env.items() if k not in _NOT_FOR_WORKERS}
    worker_env["TASKPLAT_WORKER_QUEUE"] = queue
    worker_env.update(overrides)
    stop_timeout = (
        _seconds(worker_env, "TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS", 30.0)
        + _seconds(worker_env, "TASKPLAT_WORKER_KILL_GRACE_SECONDS", 3.0)
        + _seconds(worker_env, "TASKPLAT_WORKER_SHUTDOWN_REPORT_TIMEOUT_SECONDS", 15.0)
        + _seconds(worker_env, "TASKPLAT_WORKER_WAIT_TIME_SECONDS", 20.0)
        + 5.0
    )
    return ServiceSpec(
        name=name,
        argv=(sys.executable, "-m", WORKER_MODULE),
        env=worker_env,
        cwd=cwd,
        stop_timeout=stop_timeout,
        generation_env="TASKPLAT_WORKER_ID",
    )
