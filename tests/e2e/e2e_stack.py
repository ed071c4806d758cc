"""The end-to-end harness: the local stack (`taskplat.devstack.stack.Stack`, the code `make up`
runs) with test settings, plus HTTP, SQS and database helpers to drive and inspect it.

Invariants:
- Each stack gets its own database (created on the session's Postgres server, dropped after),
  its own SQS queue names (a unique prefix, deleted after), its own directory and a free
  dispatcher port: stacks never see each other's tasks or messages, nor `make up`'s.
- Every service is a real process; the test settings only shorten times (a 3 s lease, a 0.5 s
  reaper interval, ...) so failures are recovered from within seconds.
- Helpers only read the database (`e2e_queries.sql`); state changes go through the HTTP API or
  SQS, as a client or a worker would make them.
- Waits are conditions with deadlines (`wait_for`), never bare sleeps.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from taskplat.common.db.queries import parse_queries
from taskplat.devstack.sqs import sqs_client
from taskplat.devstack.stack import Stack, StackConfig
from taskplat.devstack.waiting import wait_for
from taskplat.testkit.testdb import with_database

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

E2E_DIR = Path(__file__).parent
OPERATORS_FILE = E2E_DIR / "e2e_operators.yaml"
_SQL_PATH = E2E_DIR / "e2e_queries.sql"
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))

LEASE_TTL_SECONDS = 3.0
TERMINAL = frozenset({"Completed", "Dead", "Canceled"})
TEST_ENV: Mapping[str, str] = {
    "TASKPLAT_LOG_FORMAT": "console",
    "TASKPLAT_DISPATCHER_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
    "TASKPLAT_REAPER_INTERVAL_SECONDS": "0.5",
    "TASKPLAT_REAPER_DEADLINE_GRACE_SECONDS": "2",
    "TASKPLAT_SCHEDULER_INTERVAL_SECONDS": "0.2",
    "TASKPLAT_SCHEDULER_REQUEUE_AFTER_SECONDS": "3",
    "TASKPLAT_RELAY_INTERVAL_SECONDS": "0.5",
    "TASKPLAT_RELAY_RETRY_BASE_SECONDS": "0.2",
    "TASKPLAT_RELAY_RETRY_MAX_SECONDS": "2",
    "TASKPLAT_WORKER_CONCURRENCY": "4",
    "TASKPLAT_WORKER_OPERATORS_FILE": str(OPERATORS_FILE),
    "TASKPLAT_WORKER_WAIT_TIME_SECONDS": "1",
    # A stopping wrapper waits for its open waiting claim (never cancelled: what it claims is
    # leased to it), so the default 10 s wait made every stack's stop take ~10 s.
    "TASKPLAT_WORKER_POLL_WAIT_SECONDS": "1",
    "TASKPLAT_WORKER_VISIBILITY_TIMEOUT_SECONDS": "10",
    "TASKPLAT_WORKER_VISIBILITY_EXTENSION_SECONDS": "3",
    "TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS": "1",
    "TASKPLAT_WORKER_KILL_GRACE_SECONDS": "1",
    "TASKPLAT_WORKER_SHUTDOWN_REPORT_TIMEOUT_SECONDS": "5",
    "PYTHONPATH": str(E2E_DIR),
}

# Stacks running right now, so a failing test can show their logs (see conftest.py).
ACTIVE: list[E2EStack] = []
_numbers = itertools.count()

Row = dict[str, Any]


def process_gone(pid: int) -> bool:
    """True once `pid` no longer runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def read_pid(pid_dir: Path, task_id: str, attempt: int, *, timeout: float = 20.0) -> int:
    """The pid the `record`/`hang` operator wrote for this attempt (waits for the file)."""
    path = pid_dir / f"{task_id}.{attempt}.pid"
    wait_for(path.exists, timeout=timeout, what=f"operator pid file {path.name}")
    return int(path.read_text())


def marker_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


@dataclass
class E2EStack:
    """A running stack and the clients to use it."""

    stack: Stack
    name: str
    database_url: str
    queue_prefix: str
    api: httpx.Client
    internal: httpx.Client
    sqs: SQSClient
    run_dir: Path
    _urls: dict[str, str] = field(default_factory=dict)

    # -- public API ---------------------------------------------------------------------------

    def create(self, operator: str, **fields: Any) -> Row:
        response = self.api.post("/tasks", json={"operator": operator, **fields})
        assert response.status_code == 201, response.text
        task: Row = response.json()
        return task

    def create_many(
        self, bodies: Sequence[Mapping[str, Any]], *, threads: int = 8, timeout: float = 60.0
    ) -> list[str]:
        """POST every body; a refused connection or a 5xx (the dispatcher restarting) is retried
        until `timeout`, with an idempotency key so a retry never creates a second task."""
        run = uuid.uuid4().hex

        def post(numbered: tuple[int, Mapping[str, Any]]) -> str:
            number, body = numbered
            payload = {"idempotency_key": f"{run}-{number}", **body}

            def attempt() -> str | None:
                try:
                    response = self.api.post("/tasks", json=payload)
                except httpx.TransportError:
                    return None
                if response.status_code >= 500:
                    return None
                assert response.status_code in (200, 201), response.text
                task_id: str = response.json()["task_id"]
                return task_id

            task_id = wait_for(attempt, timeout=timeout, what="POST /tasks", interval=0.1)
            assert task_id is not None
            return task_id

        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(post, enumerate(bodies)))

    def get(self, task_id: str) -> Row:
        response = self.api.get(f"/tasks/{task_id}")
        assert response.status_code == 200, response.text
        task: Row = response.json()
        return task

    def wait_status(self, task_id: str, *statuses: str, timeout: float = 30.0) -> Row:
        last: Row = {}

        def reached() -> bool:
            nonlocal last
            last = self.get(task_id)
            return last["status"] in statuses

        try:
            wait_for(
                reached, timeout=timeout, what=f"task {task_id} to be {statuses}", interval=0.1
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last seen: {last}") from None
        return last

    # -- database (read only) -----------------------------------------------------------------

    def rows(self, name: str, **params: Any) -> list[Row]:
        with psycopg.connect(self.database_url, row_factory=dict_row, autocommit=True) as conn:
            cursor = conn.execute(Q[name], params)
            return cursor.fetchall()

    def status_counts(self, task_ids: Sequence[str]) -> Counter[str]:
        rows = self.rows("status_counts", ids=list(task_ids))
        return Counter({row["status"]: row["tasks"] for row in rows})

    def wait_all_terminal(self, task_ids: Sequence[str], *, timeout: float) -> Counter[str]:
        last: Counter[str] = Counter()

        def done() -> bool:
            nonlocal last
            last = self.status_counts(task_ids)
            return sum(last[s] for s in TERMINAL) == len(task_ids)

        try:
            wait_for(done, timeout=timeout, what=f"{len(task_ids)} tasks to finish", interval=0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; statuses: {dict(last)}") from None
        return last

    # -- SQS ----------------------------------------------------------------------------------

    def queue_url(self, sqs_queue_name: str) -> str:
        if sqs_queue_name not in self._urls:
            url = self.sqs.get_queue_url(QueueName=sqs_queue_name)["QueueUrl"]
            self._urls[sqs_queue_name] = url
        return self._urls[sqs_queue_name]

    def task_queue_url(self, queue: str = "default") -> str:
        return self.queue_url(f"{self.queue_prefix}{queue}")

    @property
    def dead_letter_queue_url(self) -> str:
        return self.queue_url(f"{self.queue_prefix}dead-letters")

    def send_wake_up(self, task_id: str, queue: str = "default") -> None:
        self.sqs.send_message(
            QueueUrl=self.task_queue_url(queue), MessageBody=f'{{"task_id": "{task_id}"}}'
        )

    def queue_depth(self, queue: str = "default") -> int:
        """Messages visible, in flight or delayed in a task queue."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.task_queue_url(queue),
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def log_tails(self, lines: int = 30) -> dict[str, str]:
        tails = {}
        for path in sorted(self.stack.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            tails[path.stem] = "\n".join(text)
        return tails


def _admin(server_url: str, statement: sql.Composed) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(statement)


def _delete_queues(client: SQSClient, prefix: str) -> None:
    for url in client.list_queues(QueueNamePrefix=prefix).get("QueueUrls", []):
        client.delete_queue(QueueUrl=url)


@contextmanager
def e2e_stack(
    name: str,
    base_dir: Path,
    *,
    database_server_url: str,
    sqs_endpoint_url: str,
    workers: int = 2,
    queues: tuple[str, ...] = ("default",),
    worker_queues: tuple[str, ...] = ("default",),
    env: Mapping[str, str] | None = None,
    data_services: bool = False,
) -> Iterator[E2EStack]:
    """Run a stack with the test settings (plus `env`) for the duration of the block."""
    number = next(_numbers)
    database = f"e2e_{os.getpid()}_{number}_{name}"
    prefix = f"e2e{os.getpid()}-{number}-{name}-"
    _admin(database_server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    database_url = with_database(database_server_url, database)
    config = StackConfig(
        run_dir=base_dir,
        workers=workers,
        queues=queues,
        worker_queues=worker_queues,
        dispatcher_port=None,
        database_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        queue_prefix=prefix,
        dead_letter_queue=f"{prefix}dead-letters",
        inherit_environment=False,
        env={**TEST_ENV, **(env or {})},
        restart_backoff_seconds=0.2,
        restart_backoff_max_seconds=2.0,
        data_services=data_services,
    )
    stack = Stack(config)
    client = sqs_client(sqs_endpoint_url)
    try:
        started = time.monotonic()
        info = stack.start()
        print(f"e2e stack {name!r} up in {time.monotonic() - started:.1f}s; logs in {base_dir}")
        with (
            httpx.Client(
                base_url=info.dispatcher_url,
                headers={"Authorization": f"Bearer {info.api_key}"},
                timeout=30.0,
            ) as api,
            httpx.Client(
                base_url=info.dispatcher_url,
                headers={"Authorization": f"Bearer {info.worker_token}"},
                timeout=30.0,
            ) as internal,
        ):
            running = E2EStack(
                stack=stack,
                name=name,
                database_url=database_url,
                queue_prefix=prefix,
                api=api,
                internal=internal,
                sqs=client,
                run_dir=base_dir,
            )
            ACTIVE.append(running)
            try:
                yield running
            finally:
                ACTIVE.remove(running)
    finally:
        stack.stop()
        _delete_queues(client, prefix)
        client.close()
        _admin(
            database_server_url,
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)),
        )


def new_marker(directory: Path) -> Path:
    return directory / f"marker-{uuid.uuid4().hex[:8]}.txt"
