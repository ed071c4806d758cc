"""One stack of the benchmark: `Stack` with the bench's settings, plus what the workloads need
to drive and observe it (queries, SQS request log, /metrics, /proc).

Invariants:
- A bench stack is private: its own directory under the bench's run dir, free ports, a fresh
  database (`keep_data=False`), Postgres with fsync and synchronous_commit on, LocalStack SQS,
  every service and `workers` worker wrappers running the bench's operators.
- The stack does not inherit the caller's environment: its settings are the bench's
  (`config.BASE_ENV`) plus the variant's and the workload's overrides, and nothing else (but
  `PYTHONPATH`, so the services run the code the bench runs), so two runs of the bench on two
  machines run the same configuration.
- The bench only reads the database (`bench.sql`), except W4's prefill; tasks are created over
  HTTP, as a client would.
- Idle means: no unfinished task, an empty SQS task queue (no stale wake-up ahead of a run's
  own; W3, whose killed wrapper leaves a message in flight until its visibility timeout,
  tolerates in-flight ones) and every wrapper healthy; every run starts idle.
- `stop()` is idempotent and always leaves the service logs in `<dir>/logs` for inspection.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, LiteralString

import httpx
import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from taskplat.bench.client import BenchError
from taskplat.bench.config import CONCURRENCY, DEFAULT_CONCURRENCY
from taskplat.bench.probes import (
    CpuSnapshot,
    SqsRequestLog,
    cpu_snapshot,
    peak_rss_mib,
    scrape,
)
from taskplat.common.db.queries import load_queries
from taskplat.devstack.sqs import sqs_client
from taskplat.devstack.stack import Stack, StackConfig
from taskplat.devstack.waiting import wait_for

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

QUERIES = load_queries("taskplat.bench", "bench.sql")
OPERATORS_SCRIPT = str(Path(__file__).with_name("operators.py").absolute())
_POOL_SIZE = re.compile(r"^(\s*pool_size:\s*)\d+\s*$", re.MULTILINE)
Say = Callable[[str], None]


def operators_file(directory: Path, pool_size: int) -> Path:
    """Write the bench's operators file: the operators script's path filled in, the pooled
    operators' `pool_size` set."""
    text = resources.files("taskplat.bench").joinpath("operators.yaml").read_text()
    text = text.replace('"{operators_py}"', json.dumps(OPERATORS_SCRIPT))
    path = directory / "operators.yaml"
    path.write_text(_POOL_SIZE.sub(lambda m: f"{m.group(1)}{pool_size}", text))
    return path


CALLS_HISTOGRAM_COUNT = "taskplat_http_server_duration_seconds_count"


class BenchStack:
    """A started bench stack (use as a context manager)."""

    def __init__(
        self,
        directory: Path,
        env: Mapping[str, str],
        *,
        workers: int,
        say: Say,
        data_services: bool = False,
    ) -> None:
        self.directory = directory.absolute()
        self.data_services = data_services  # the broker and the query service too (W6)
        self.env = dict(env)
        self.workers = workers
        self.say = say
        self.stack: Stack | None = None
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._sqs: SQSClient | None = None
        self._queue_url = ""
        self.sqs_log: SqsRequestLog | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> BenchStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.directory / "logs", ignore_errors=True)
        concurrency = int(self.env.get(CONCURRENCY, DEFAULT_CONCURRENCY))
        env = {
            **self.env,
            "TASKPLAT_WORKER_OPERATORS_FILE": str(operators_file(self.directory, concurrency)),
        }
        if os.environ.get("PYTHONPATH"):  # the services run the code the bench runs
            env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
        config = StackConfig(
            run_dir=self.directory,
            workers=self.workers,
            dispatcher_port=None,
            keep_data=False,
            fsync=True,
            inherit_environment=False,
            env=env,
            data_services=self.data_services,
        )
        self.say(f"starting a stack in {self.directory} ...")
        started = time.monotonic()
        self.stack = Stack(config)
        self.stack.start()
        server = self.stack.sqs_server
        if server is None:
            raise BenchError("the stack runs no local SQS server; the bench needs its own")
        self.sqs_log = SqsRequestLog(*server)
        self._conn = psycopg.connect(
            self.stack.info.database_url, autocommit=True, row_factory=dict_row
        )
        self.wait_workers_ready()
        self.say(f"stack ready in {time.monotonic() - started:.1f}s ({server[0]} SQS)")

    def stop(self) -> None:
        if self._sqs is not None:
            self._sqs.close()
            self._sqs = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.stack is not None:
            self.say("stopping the stack ...")
            self.stack.stop()
            self.stack = None

    # -- access -----------------------------------------------------------------------------

    def running(self) -> Stack:
        if self.stack is None:
            raise BenchError("the bench stack is not running")
        return self.stack

    @property
    def dispatcher_url(self) -> str:
        return self.running().info.dispatcher_url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.running().info.api_key}"}

    @property
    def database_url(self) -> str:
        return self.running().info.database_url

    @property
    def lease_ttl(self) -> float:
        return float(self.env["TASKPLAT_DISPATCHER_LEASE_TTL_SECONDS"])

    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        if self._conn is None:
            raise BenchError("the bench stack is not running")
        sql: LiteralString = QUERIES[name]
        return self._conn.execute(sql, params or None).fetchall()

    def query_exec(self, name: str, **params: Any) -> None:
        """Run a statement that returns no rows (W4's prefill and VACUUM)."""
        if self._conn is None:
            raise BenchError("the bench stack is not running")
        sql: LiteralString = QUERIES[name]
        self._conn.execute(sql, params or None)

    def execute(self, statement: pgsql.Composed) -> list[dict[str, Any]]:
        """A composed read (W5's dataset table, named through psycopg.sql)."""
        if self._conn is None:
            raise BenchError("the bench stack is not running")
        return self._conn.execute(statement).fetchall()

    def one(self, name: str, **params: Any) -> dict[str, Any]:
        rows = self.query(name, **params)
        if not rows:
            raise BenchError(f"query {name} returned no row")
        return rows[0]

    def worker_names(self) -> list[str]:
        return [name for name in self.running().services() if name.startswith("worker")]

    def restart_workers(self) -> None:
        """Restart every worker wrapper (fresh processes, as a new deployment starts them) and
        wait until each is ready."""
        for name in self.worker_names():
            self.running().restart(name)
        self.wait_workers_ready()

    def wait_workers_ready(self, timeout: float = 60.0) -> None:
        """Every worker wrapper runs and its /healthz answers 200 (it polls SQS)."""
        stack = self.running()

        def ready() -> bool:
            for name in self.worker_names():
                url = stack.ops_urls.get(name)
                if name not in stack.pids() or url is None:
                    return False
                try:
                    if httpx.get(f"{url}/healthz", timeout=2.0).status_code != 200:
                        return False
                except httpx.HTTPError:
                    return False
            return True

        wait_for(ready, timeout=timeout, what="the worker wrappers' /healthz", interval=0.1)

    def sqs_backlog(self, *, in_flight: bool = True) -> int:
        """Messages in the task queue: visible, delayed and (`in_flight`) received but not yet
        deleted (approximate counts)."""
        stack = self.running()
        if self._sqs is None:
            self._sqs = sqs_client(stack.info.sqs_endpoint_url, stack.config.aws_region)
            name = f"{stack.config.queue_prefix}{stack.config.queues[0]}"
            self._queue_url = self._sqs.get_queue_url(QueueName=name)["QueueUrl"]
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=self._queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return sum(
            int(value)
            for name, value in attributes.items()
            if in_flight or name != "ApproximateNumberOfMessagesNotVisible"
        )

    def wait_queue_empty(self, timeout: float = 600.0) -> float:
        """Wait until the task queue holds no message at all; return the seconds waited."""
        started = time.monotonic()
        wait_for(
            lambda: self.sqs_backlog() == 0,
            timeout=timeout,
            what="the SQS task queue to empty",
            interval=0.2,
        )
        return round(time.monotonic() - started, 2)

    def wait_idle(self, timeout: float = 900.0, *, in_flight_ok: bool = False) -> float:
        """Wait until no task is left to run, the task queue holds no message (stale wake-ups
        ahead of a run's own would delay them; with `in_flight_ok`, messages received and not
        yet deleted may remain) and every wrapper is up; return the seconds waited."""
        started = time.monotonic()

        def idle() -> bool:
            if self.one("unfinished")["n"] != 0:
                return False
            return self.sqs_backlog(in_flight=not in_flight_ok) == 0

        wait_for(
            idle,
            timeout=timeout,
            what="every earlier task to finish and the SQS queue to empty",
            interval=0.2,
        )
        self.wait_workers_ready()
        return round(time.monotonic() - started, 2)

    # -- observation ------------------------------------------------------------------------

    def sqs_counters(self) -> dict[str, dict[str, float]]:
        """`taskplat_sqs_*` samples of the relay's and the wrappers' /metrics (the dispatcher's
        is not scraped: its state gauges query the database)."""
        urls = self.running().ops_urls
        return {
            name: scrape(url)
            for name, url in urls.items()
            if name == "relay" or name.startswith("worker")
        }

    def dispatcher_calls(self) -> dict[str, float]:
        """The dispatcher's HTTP requests so far, by `METHOD route` (its request-duration
        histogram's counts)."""
        samples = scrape(self.dispatcher_url, prefix=CALLS_HISTOGRAM_COUNT)
        calls: dict[str, float] = {}
        for key, count in samples.items():
            method = re.search(r'method="([^"]*)"', key)
            route = re.search(r'route="([^"]*)"', key)
            if method and route:
                name = f"{method.group(1)} {route.group(1)}"
                calls[name] = calls.get(name, 0.0) + count
        return calls

    def cpu_groups(self) -> dict[str, list[int]]:
        stack = self.running()
        pids = stack.pids()
        groups: dict[str, list[int]] = {
            name: [pid] for name, pid in pids.items() if not name.startswith("worker")
        }
        groups["worker wrappers"] = [pid for n, pid in pids.items() if n.startswith("worker")]
        if stack.postgres_pid is not None:
            groups["postgres"] = [stack.postgres_pid]
        if stack.sqs_pid is not None:
            groups["sqs server"] = [stack.sqs_pid]
        return groups

    def cpu_snapshot(self) -> CpuSnapshot:
        snapshot = cpu_snapshot(
            self.cpu_groups(), time.monotonic(), split_children=["worker wrappers"]
        )
        snapshot.seconds["operators"] = snapshot.seconds.pop("worker wrappers children", 0.0)
        times = os.times()
        snapshot.seconds["bench client"] = times.user + times.system
        return snapshot

    def peak_rss(self) -> dict[str, float]:
        return peak_rss_mib(self.running().pids())

    def settle_sqs(self, quiet: float = 0.5, timeout: float = 5.0) -> None:
        """Wait until the SQS server logged no request for `quiet` seconds (or `timeout`)."""
        log = self.sqs_log
        if log is None:
            return
        deadline = time.monotonic() + timeout
        size, since = log.size(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now_size = log.size()
            if now_size != size:
                size, since = now_size, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
