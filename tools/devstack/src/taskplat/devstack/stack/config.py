"""What a local stack runs and with which settings: `StackConfig`, and `from_environment` for
`make up`.

Invariants:
- A config is immutable; `Stack` derives every process's environment from it and nothing else
  (plus the caller's environment when `inherit_environment` is true).
- Environment layering, lowest first: the inherited environment (or a minimal one), then
  `DEV_DEFAULTS` for names the inherited environment does not set, then the values the stack owns
  (URLs, secrets, ports, queue names), then `env`, then a service's own `service_env`. So a
  developer can override any service setting from the shell, and tests override everything.
- `worker_queues=None` means every queue of `queues`; each gets `workers` worker wrappers.
- `dispatcher_port=None`, `pg_port=None` and `sqs_port=None` mean "a free port"; a fixed
  dispatcher port that is taken is refused before anything starts.
- `fsync=False` (development) runs the private Postgres with fsync and synchronous_commit off;
  `fsync=True` (the benchmark) keeps Postgres's durable defaults.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from taskplat.devstack.errors import DevstackError

DEFAULT_DISPATCHER_PORT = 8080
DEFAULT_WORKERS = 2
DEFAULT_QUEUE = "default"

# Fast recovery and a quick Ctrl-C in development; each one yields to the developer's environment.
DEV_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {
        "TASKPLAT_LOG_FORMAT": "console",
        "TASKPLAT_DISPATCHER_LEASE_TTL_SECONDS": "10",
        "TASKPLAT_REAPER_INTERVAL_SECONDS": "1",
        "TASKPLAT_REAPER_DEADLINE_GRACE_SECONDS": "5",
        "TASKPLAT_SCHEDULER_INTERVAL_SECONDS": "0.5",
        "TASKPLAT_SCHEDULER_REQUEUE_AFTER_SECONDS": "15",
        "TASKPLAT_WORKER_WAIT_TIME_SECONDS": "5",
        "TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS": "5",
        "TASKPLAT_WORKER_SHUTDOWN_REPORT_TIMEOUT_SECONDS": "5",
        "TASKPLAT_WORKER_VISIBILITY_TIMEOUT_SECONDS": "30",
        "TASKPLAT_WORKER_VISIBILITY_EXTENSION_SECONDS": "10",
    }
)
# What a child gets when the caller's environment is not inherited.
MINIMAL_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER")
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

LineSink = Callable[[str], None]


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class StackConfig:
    """Everything a `Stack` needs; see the module doc for how the environment is layered."""

    run_dir: Path
    workers: int = DEFAULT_WORKERS  # worker wrappers per queue in `worker_queues`
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    worker_queues: tuple[str, ...] | None = None
    dispatcher_port: int | None = DEFAULT_DISPATCHER_PORT
    pg_port: int | None = None
    sqs_port: int | None = None
    database_url: str | None = None
    sqs_endpoint_url: str | None = None
    sqs_server: str | None = None
    aws_region: str = "us-east-1"
    queue_prefix: str = "taskplat-"
    dead_letter_queue: str = "taskplat-dead-letters"
    max_receive_count: int = 5
    keep_data: bool = True
    fsync: bool = False
    # Run the credential broker and the query service too (with capability keys, the data bucket
    # and the query service's read-only database user): `make up` and `make demo` do.
    data_services: bool = False
    inherit_environment: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    service_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    echo: LineSink | None = None
    restart_backoff_seconds: float = 0.5
    restart_backoff_max_seconds: float = 10.0
    ready_timeout_seconds: float = 60.0
    stop_timeout_seconds: float = 20.0

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise DevstackError(f"workers must be 0 or more, not {self.workers}")
        if not self.queues:
            raise DevstackError("at least one task queue is needed")
        worker_queues = self.queues if self.worker_queues is None else self.worker_queues
        for queue in (*self.queues, *worker_queues):
            if not _QUEUE_NAME.match(queue):
                raise DevstackError(f"bad task queue name {queue!r}: use [A-Za-z0-9_-], 1-64")
            if queue not in self.queues:
                raise DevstackError(f"workers' queue {queue!r} is not one of {self.queues}")
        object.__setattr__(self, "run_dir", Path(self.run_dir).absolute())
        object.__setattr__(self, "env", _frozen(self.env))
        object.__setattr__(
            self,
            "service_env",
            MappingProxyType({k: _frozen(v) for k, v in self.service_env.items()}),
        )

    @property
    def served_queues(self) -> tuple[str, ...]:
        """The queues that get `workers` worker wrappers each."""
        return self.queues if self.worker_queues is None else tuple(self.worker_queues)

    def base_environment(self) -> dict[str, str]:
        """The inherited environment (or the minimal one) with `DEV_DEFAULTS` filled in."""
        if self.inherit_environment:
            env = dict(os.environ)
        else:
            env = {name: os.environ[name] for name in MINIMAL_ENV_NAMES if name in os.environ}
        for name, value in DEV_DEFAULTS.items():
            env.setdefault(name, value)
        return env


def _int_env(name: str, default: int | None, *, minimum: int, maximum: int) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise DevstackError(f"{name}={raw!r} is not a whole number") from None
    if not minimum <= value <= maximum:
        raise DevstackError(f"{name}={value} is out of range {minimum}-{maximum}")
    return value


def queues_from_env(raw: str | None) -> tuple[str, ...]:
    """`TASKPLAT_QUEUES`: comma-separated task queue names (default: just `default`)."""
    names = tuple(dict.fromkeys(part.strip() for part in (raw or "").split(",") if part.strip()))
    return names or (DEFAULT_QUEUE,)


def from_environment(
    run_dir: Path,
    *,
    workers: int | None = None,
    pg_port: int | None = None,
    sqs_port: int | None = None,
    echo: LineSink | None = None,
) -> StackConfig:
    """The config of `make up`: arguments first, then `TASKPLAT_WORKERS`, `TASKPLAT_QUEUES`,
    `TASKPLAT_DISPATCHER_PORT`, `DATABASE_URL`, `SQS_ENDPOINT_URL`, `AWS_REGION`,
    `TASKPLAT_SQS_QUEUE_PREFIX`, `TASKPLAT_DEAD_LETTER_QUEUE`, `TASKPLAT_SQS_SERVER`,
    `TASKPLAT_DATA_SERVICES` (`0`: no credential broker nor query service)."""
    if workers is None:
        workers = _int_env("TASKPLAT_WORKERS", DEFAULT_WORKERS, minimum=0, maximum=64)
    port = _int_env("TASKPLAT_DISPATCHER_PORT", DEFAULT_DISPATCHER_PORT, minimum=1, maximum=65535)
    queues = queues_from_env(os.environ.get("TASKPLAT_QUEUES"))
    return StackConfig(
        run_dir=run_dir,
        workers=workers or 0,
        queues=queues,
        dispatcher_port=port,
        pg_port=pg_port,
        sqs_port=sqs_port,
        database_url=os.environ.get("DATABASE_URL") or None,
        sqs_endpoint_url=os.environ.get("SQS_ENDPOINT_URL") or None,
        sqs_server=os.environ.get("TASKPLAT_SQS_SERVER") or None,
        aws_region=os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1",
        queue_prefix=os.environ.get("TASKPLAT_SQS_QUEUE_PREFIX") or "taskplat-",
        dead_letter_queue=os.environ.get("TASKPLAT_DEAD_LETTER_QUEUE") or "taskplat-dead-letters",
        data_services=os.environ.get("TASKPLAT_DATA_SERVICES", "1").strip() != "0",
        echo=echo,
    )
