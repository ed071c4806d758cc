"""The whole local platform as one object: Postgres, SQS, queues, migrations and every service.

    with Stack(StackConfig(run_dir=Path(".run"))) as stack:
        print(stack.info.dispatcher_url)

`make up` (`python -m taskplat.devstack up`), `make demo` and the end-to-end tests all run this
same code; tests give it a private directory and free ports, so they never collide with `make up`.

Invariants:
- `start()` either returns with every service running and the dispatcher answering `/readyz`, or
  stops everything it started and raises `DevstackError` (with the relevant log tail).
- `<run_dir>/stack.env` exists while the stack runs (written last by `start()`, removed first
  by `stop()`).
- `stop()` stops what this object started and nothing else, in order: worker wrappers (they drain
  and report to the dispatcher), then the other services, then SQS, then Postgres. Idempotent.
- Postgres and SQS are started only when the config names no `database_url` / `sqs_endpoint_url`;
  Postgres keeps its data in `<run_dir>/postgres` across restarts unless `keep_data` is false.
- Worker wrappers get no database URL, no API keys and no attempt-token signing keys
  (docs/security.md: workers never hold database credentials); every service gets the same
  environment otherwise.
- Servers are started with die-with-parent from the thread that calls `start()`: call it from a
  thread that outlives the stack (the main thread, or a pytest fixture).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from taskplat.devstack.errors import DevstackError
from taskplat.devstack.ports import free_port
from taskplat.devstack.postgres import PrivatePostgres
from taskplat.devstack.procs import read_tail
from taskplat.devstack.sqs import LocalSqs
from taskplat.devstack.stack import bootstrap, data_services
from taskplat.devstack.stack.config import StackConfig
from taskplat.devstack.stack.echo import LogEcho
from taskplat.devstack.stack.secrets import env_file_text, load_or_create_secrets, write_private
from taskplat.devstack.stack.services import (
    OPS_PORT_SETTINGS,
    SERVICES,
    WORKER_GROUP,
    WORKER_MODULE,
    port_is_free,
    require_installed,
    service_spec,
    worker_spec,
)
from taskplat.devstack.stack.supervisor import Supervisor
from taskplat.devstack.waiting import wait_for


@dataclass(frozen=True)
class StackInfo:
    """How to reach a running stack (what `stack.env` holds)."""

    dispatcher_url: str
    api_key: str
    worker_token: str
    database_url: str
    sqs_endpoint_url: str
    env_file: Path
    # The data services (when the config runs them): the credential broker and the query service.
    credentials_url: str | None = None
    query_url: str | None = None

    def as_env(self) -> dict[str, str]:
        env = {
            "DISPATCHER_URL": self.dispatcher_url,
            "TASKPLAT_URL": self.dispatcher_url,  # the `taskplat` command's setting
            "TASKPLAT_API_KEY": self.api_key,
            "TASKPLAT_WORKER_TOKEN": self.worker_token,
            "DATABASE_URL": self.database_url,
            "SQS_ENDPOINT_URL": self.sqs_endpoint_url,
        }
        if self.credentials_url is not None:
            env["TASKPLAT_CREDENTIALS_URL"] = self.credentials_url
        if self.query_url is not None:
            env["TASKPLAT_QUERY_URL"] = self.query_url
        return env


class Stack:
    """Starts, supervises and stops one local Taskplat platform."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self._postgres: PrivatePostgres | None = None
        self._sqs: LocalSqs | None = None
        self._supervisor: Supervisor | None = None
        self._echo: LogEcho | None = None
        self._info: StackInfo | None = None
        self._env: dict[str, str] = {}
        self._worker_count = 0
        self.ops_urls: dict[str, str] = {}
        self._data_urls: dict[str, str] = {}

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def info(self) -> StackInfo:
        if self._info is None:
            raise DevstackError("the stack has not been started")
        return self._info

    @property
    def log_dir(self) -> Path:
        return self.config.run_dir / "logs"

    def start(self) -> StackInfo:
        if self._info is not None:
            return self._info
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._info is not None:
            self._info.env_file.unlink(missing_ok=True)  # it describes a running stack
        if self._supervisor is not None:
            workers = [name for name in self._supervisor.names() if name.startswith("worker")]
            self._supervisor.close(names_first=workers)
            self._supervisor = None
        if self._echo is not None:
            self._echo.stop()
            self._echo = None
        if self._sqs is not None:
            self._sqs.stop()
            self._sqs = None
        if self._postgres is not None:
            self._postgres.stop(remove_data=not self.config.keep_data)
            self._postgres = None
        self._info = None

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> StackInfo:
        config = self.config
        try:
            config.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DevstackError(f"cannot create {config.run_dir}: {exc.strerror}") from exc
        modules = list(SERVICES.values())
        if config.workers > 0:
            modules.append(WORKER_MODULE)
        if config.data_services:
            modules.extend(data_services.DATA_SERVICES.values())
        require_installed(modules)
        secrets = load_or_create_secrets(config.run_dir / "secrets.env")
        port = config.dispatcher_port or free_port()
        if config.dispatcher_port is not None and not port_is_free(port):
            raise DevstackError(
                f"the dispatcher port {port} on 127.0.0.1 is already in use (another "
                "`make up`?): stop that process or set TASKPLAT_DISPATCHER_PORT to a free port"
            )
        database_url = config.database_url or self._start_postgres()
        sqs_endpoint_url = config.sqs_endpoint_url or self._start_sqs()
        bootstrap.create_queues(config, sqs_endpoint_url)
        bootstrap.migrate(database_url)
        dispatcher_url = f"http://127.0.0.1:{port}"
        self._env = bootstrap.shared_env(
            config,
            database_url,
            sqs_endpoint_url,
            dispatcher_url,
            port,
            secrets.api_key,
            secrets.worker_token,
        )
        data_envs = self._data_envs(database_url, sqs_endpoint_url, secrets.worker_token)
        if config.echo is not None:
            self._echo = LogEcho(config.echo)
            self._echo.start()
        self._supervisor = Supervisor(
            self.log_dir,
            restart_backoff=config.restart_backoff_seconds,
            restart_backoff_max=config.restart_backoff_max_seconds,
            on_spawn=self._echo.follow if self._echo is not None else None,
        )
        self._supervisor.start()
        self.ops_urls = {"dispatcher": dispatcher_url, **self._data_urls}
        for name, module in SERVICES.items():
            overrides = self._with_ops_port(name, name, dict(self.config.service_env.get(name, {})))
            spec = service_spec(name, module, self._env, overrides, cwd=config.run_dir)
            self._supervisor.add(spec)
        for name, env in data_envs.items():
            module = data_services.DATA_SERVICES[name]
            spec = service_spec(name, module, env, {}, cwd=config.run_dir)
            self._supervisor.add(spec)
        for queue in config.served_queues:
            for _ in range(config.workers):
                self.add_worker(queue)
        self._wait_ready(dispatcher_url)
        for name in data_envs:
            self._wait_healthy(name, self.ops_urls[name])
        info = StackInfo(
            dispatcher_url=dispatcher_url,
            api_key=secrets.api_key,
            worker_token=secrets.worker_token,
            database_url=database_url,
            sqs_endpoint_url=sqs_endpoint_url,
            env_file=config.run_dir / "stack.env",
            credentials_url=self.ops_urls.get("credential-broker"),
            query_url=self.ops_urls.get("query-service"),
        )
        write_private(
            info.env_file,
            env_file_text(
                info.as_env(),
                f"The running local Taskplat stack (written by `make up`): source {info.env_file}",
            ),
        )
        self._info = info
        return info

    # -- infrastructure ---------------------------------------------------------------------

    def _start_postgres(self) -> str:
        server = PrivatePostgres(
            self.config.run_dir / "postgres",
            port=self.config.pg_port,
            fsync=self.config.fsync,
            die_with_parent=True,
        )
        if not self.config.keep_data:
            server.stop(remove_data=True)  # a fresh cluster: leftovers of an earlier run go
        self._postgres = server
        return server.start()

    def _start_sqs(self) -> str:
        server = LocalSqs(
            self.config.run_dir / "sqs",
            port=self.config.sqs_port,
            die_with_parent=True,
            server="moto" if self.config.sqs_server == "moto" else None,
        )
        self._sqs = server
        return server.start()

    # -- services ---------------------------------------------------------------------------

    def _data_envs(
        self, database_url: str, endpoint_url: str, worker_token: str
    ) -> dict[str, dict[str, str]]:
        """When the config runs the data services: capability keys for the dispatcher, the
        services' URLs for the workers (`self._env`), and each data service's own environment."""
        if not self.config.data_services:
            return {}
        query_database_url = data_services.create_query_user(database_url, worker_token)
        data_services.create_bucket(endpoint_url, self.config.aws_region)
        broker_port, query_port = free_port(), free_port()
        self._data_urls = {
            "credential-broker": f"http://127.0.0.1:{broker_port}",
            "query-service": f"http://127.0.0.1:{query_port}",
        }
        self._env.update(data_services.capability_env(worker_token))
        self._env["TASKPLAT_CREDENTIALS_URL"] = self._data_urls["credential-broker"]
        self._env["TASKPLAT_QUERY_URL"] = self._data_urls["query-service"]
        return data_services.service_envs(
            self._env,
            endpoint_url=endpoint_url,
            broker_port=broker_port,
            query_port=query_port,
            query_database_url=query_database_url,
        )

    def _wait_healthy(self, name: str, url: str) -> None:
        supervisor = self._require_supervisor()

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(healthy, timeout=self.config.ready_timeout_seconds, what=f"{name} /healthz")
        except TimeoutError as exc:
            tail = read_tail(supervisor.log_path(name))
            raise DevstackError(f"{name} did not become healthy: {exc}\n{tail}") from exc

    @property
    def env(self) -> dict[str, str]:
        """The environment every service shares (a copy)."""
        return dict(self._env)

    def add_worker(self, queue: str | None = None, *, env: dict[str, str] | None = None) -> str:
        """Start one more worker wrapper (on `queue`, default the first served one); return its
        service name."""
        queue = queue or (self.config.served_queues or self.config.queues)[0]
        if queue not in self.config.queues:
            raise DevstackError(f"queue {queue!r} is not one of this stack's {self.config.queues}")
        self._worker_count += 1
        single = self.config.served_queues == ("default",) and queue == "default"
        name = f"worker-{self._worker_count}" if single else f"worker-{queue}-{self._worker_count}"
        overrides = {**self.config.service_env.get(WORKER_GROUP, {}), **(env or {})}
        overrides = self._with_ops_port(name, WORKER_GROUP, overrides)
        spec = worker_spec(name, queue, self._env, overrides, cwd=self.config.run_dir)
        self._require_supervisor().add(spec)
        return name

    def add_replica(self, service: str) -> str:
        """Start one more process of a service (`sink`, `relay`, ...; a `dispatcher` replica
        listens on a free port of its own, its URL in `ops_urls`); return its name."""
        module = SERVICES[service]
        supervisor = self._require_supervisor()
        taken = set(supervisor.names())
        number = 2
        while f"{service}-{number}" in taken:
            number += 1
        name = f"{service}-{number}"
        overrides = self._with_ops_port(
            name, service, dict(self.config.service_env.get(service, {}))
        )
        if service == "dispatcher":
            port = free_port()
            overrides["TASKPLAT_DISPATCHER_PORT"] = str(port)
            self.ops_urls[name] = f"http://127.0.0.1:{port}"
        supervisor.add(service_spec(name, module, self._env, overrides, cwd=self.config.run_dir))
        return name

    def _with_ops_port(self, name: str, group: str, overrides: dict[str, str]) -> dict[str, str]:
        """Give a loop or worker a free /metrics and /healthz port unless one is configured."""
        setting = OPS_PORT_SETTINGS.get(group)
        if setting is None:
            return overrides
        port = overrides.get(setting) or self._env.get(setting) or str(free_port())
        self.ops_urls[name] = f"http://127.0.0.1:{port}"
        return {**overrides, setting: port}

    def _require_supervisor(self) -> Supervisor:
        if self._supervisor is None:
            raise DevstackError("the stack is not running")
        return self._supervisor

    def _wait_ready(self, dispatcher_url: str) -> None:
        supervisor = self._require_supervisor()

        def ready() -> bool:
            if supervisor.exits("dispatcher"):
                tail = read_tail(supervisor.log_path("dispatcher"))
                raise DevstackError(f"the dispatcher exited while starting:\n{tail}")
            try:
                return httpx.get(f"{dispatcher_url}/readyz", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(ready, timeout=self.config.ready_timeout_seconds, what="/readyz", interval=0.1)
        except TimeoutError as exc:
            tail = read_tail(supervisor.log_path("dispatcher"))
            raise DevstackError(f"the dispatcher did not become ready: {exc}\n{tail}") from exc

    # -- control, for tests and tools -------------------------------------------------------

    @property
    def postgres_pid(self) -> int | None:
        """The private Postgres server's pid (None when the config names a database URL)."""
        return self._postgres.pid if self._postgres is not None else None

    @property
    def sqs_pid(self) -> int | None:
        """The local SQS server's pid (None when the config names an endpoint URL)."""
        return self._sqs.pid if self._sqs is not None else None

    @property
    def sqs_server(self) -> tuple[str, Path] | None:
        """The local SQS server's kind (`localstack` or `moto`) and log file, if it runs."""
        if self._sqs is None or not self._sqs.is_running():
            return None
        return self._sqs.kind, self._sqs.log_path

    def restart_postgres(self) -> None:
        """Crash the private Postgres (immediate mode) and start it again on the same port."""
        if self._postgres is None:
            raise DevstackError("this stack runs no Postgres of its own")
        self._postgres.restart_immediate()

    def services(self) -> list[str]:
        return self._require_supervisor().names()

    def pids(self) -> dict[str, int]:
        """Pids of the services running right now (a restarting one is missing)."""
        return self._require_supervisor().pids()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal a service's main process (SIGKILL: a crash); the stack restarts it."""
        return self._require_supervisor().kill(name, sig)

    def restart(self, name: str) -> int:
        """Stop a service gracefully and start it again; return the new pid."""
        return self._require_supervisor().restart(name)

    def remove(self, name: str) -> int | None:
        """Stop a service gracefully for good (its ops URL goes too); return its exit code."""
        code = self._require_supervisor().remove(name)
        self.ops_urls.pop(name, None)
        return code

    def generation(self, name: str) -> int:
        return self._require_supervisor().generation(name)

    def exits(self, name: str) -> list[int]:
        return self._require_supervisor().exits(name)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def wait_running(self, name: str, *, timeout: float = 30.0, not_pid: int | None = None) -> int:
        """Wait until `name` runs (with a pid other than `not_pid`); return its pid."""
        supervisor = self._require_supervisor()

        def running() -> int | None:
            pid = supervisor.pids().get(name)
            return pid if pid is not None and pid != not_pid else None

        pid = wait_for(running, timeout=timeout, what=f"{name} to run", interval=0.05)
        assert pid is not None
        return pid
