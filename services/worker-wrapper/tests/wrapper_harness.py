"""A real dispatcher process, a real SQS queue and a worker wrapper, for the wrapper's tests.

Invariants: each test gets its own database (`db_url`), its own dispatcher process on a free port
and its own SQS queue (a unique prefix), so tests never see each other's messages; wake-ups are
sent by the test itself (the relay is not running); every process and thread started here is
stopped by the fixture that started it, even when the test fails. The wrappers do not poll the
dispatcher (`poll_dispatcher`) unless a test says so: these tests drive them by their wake-ups.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
from pydantic_settings import SettingsConfigDict

from taskplat.common.settings import SqsSettings
from taskplat.common.sqs import ensure_queue, sqs_client, sqs_queue_name, wake_up_body
from taskplat.common.telemetry import Telemetry
from taskplat.devstack.ports import free_port
from taskplat.devstack.procs import Child, spawn, wait_until
from taskplat.devstack.waiting import wait_for
from taskplat.worker_wrapper.operators import load_operators
from taskplat.worker_wrapper.settings import WrapperSettings
from taskplat.worker_wrapper.worker import WorkerWrapper, build_wrapper

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

API_KEY = "wrapper-test-api-key-0123456789"
WORKER_TOKEN = "wrapper-test-worker-token-0123456789"
QUEUE = "default"
OPERATORS_SCRIPT = Path(__file__).with_name("wrapper_operators.py")
LEASE_TTL_SECONDS = 3


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.02)
    return process_gone(pid)


def write_operators_file(directory: Path) -> Path:
    """The example operators plus the test operators of `wrapper_operators.py`."""
    script = str(OPERATORS_SCRIPT)
    lines = [
        "operators:",
        "  echo:",
        '    command: ["{python}", "-m", "taskplat.worker_wrapper.examples.echo"]',
        "    mode: pooled",
        "  sleep:",
        '    command: ["{python}", "-m", "taskplat.worker_wrapper.examples.sleep"]',
    ]
    for name in ("record", "hang", "crash", "trace", "steps", "publish"):
        lines += [f"  {name}:", f'    command: ["{{python}}", "{script}", "{name}"]']
    lines += [
        "  trace-pooled:",
        f'    command: ["{{python}}", "{script}", "trace"]',
        "    mode: pooled",
    ]
    path = directory / "operators.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    load_operators(path)  # fail here, not in the wrapper, on a broken file
    return path


@dataclass
class Dispatcher:
    base_url: str
    child: Child
    api: httpx.Client

    def create(self, operator: str, **fields: Any) -> dict[str, Any]:
        response = self.api.post("/tasks", json={"operator": operator, **fields})
        assert response.status_code == 201, response.text
        task: dict[str, Any] = response.json()
        return task

    def get(self, task_id: str) -> dict[str, Any]:
        response = self.api.get(f"/tasks/{task_id}")
        assert response.status_code == 200, response.text
        task: dict[str, Any] = response.json()
        return task

    def cancel(self, task_id: str) -> dict[str, Any]:
        response = self.api.put(f"/tasks/{task_id}/cancel")
        assert response.status_code == 200, response.text
        task: dict[str, Any] = response.json()
        return task

    def wait_status(self, task_id: str, *statuses: str, timeout: float = 20) -> dict[str, Any]:
        def check() -> dict[str, Any]:
            task = self.get(task_id)
            return task if task["status"] in statuses else {}

        return wait_for(check, timeout=timeout, what=f"task {task_id} to be {statuses}")


@contextmanager
def run_dispatcher(
    db_url: str, log_dir: Path, extra_env: Mapping[str, str] | None = None
) -> Iterator[Dispatcher]:
    """A dispatcher process; `extra_env` adds or overrides its settings."""
    port = free_port()
    env = {
        "DATABASE_URL": db_url,
        "TASKPLAT_API_KEYS": API_KEY,
        "TASKPLAT_WORKER_TOKEN": WORKER_TOKEN,
        "TASKPLAT_DISPATCHER_PORT": str(port),
        "TASKPLAT_DISPATCHER_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
        "TASKPLAT_DB_POOL_MIN_SIZE": "1",
        "TASKPLAT_LOG_LEVEL": "WARNING",
        **(extra_env or {}),
    }
    child = spawn(
        "dispatcher",
        [sys.executable, "-m", "taskplat.dispatcher"],
        log_path=log_dir / "dispatcher.log",
        env=env,
        die_with_parent=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    api = httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    )
    try:
        wait_until(lambda: _ready(api), child=child, timeout=30)
        yield Dispatcher(base_url, child, api)
    finally:
        api.close()
        child.stop_group(timeout=10)


def _ready(api: httpx.Client) -> bool:
    try:
        return api.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Queue:
    """The test's own SQS queue (prefix unique to the test)."""

    settings: SqsSettings
    client: SQSClient
    url: str

    def wake(self, task_id: str) -> None:
        self.send(wake_up_body(task_id))

    def send(self, body: str) -> None:
        self.client.send_message(QueueUrl=self.url, MessageBody=body)

    def in_flight(self) -> int:
        """Messages visible or hidden (received, not deleted)."""
        attributes = self.client.get_queue_attributes(
            QueueUrl=self.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def visible(self) -> int:
        attributes = self.client.get_queue_attributes(
            QueueUrl=self.url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    def wait_empty(self, timeout: float = 15) -> None:
        wait_for(lambda: self.in_flight() == 0, timeout=timeout, what="the queue to be empty")


class _QueueSettings(SqsSettings):
    model_config = SettingsConfigDict(populate_by_name=True, extra="ignore", frozen=True)


def make_queue(sqs_endpoint_url: str) -> Queue:
    settings = _QueueSettings(
        sqs_endpoint_url=sqs_endpoint_url,
        sqs_queue_prefix=f"wt{uuid.uuid4().hex[:12]}-",
        aws_region="us-east-1",
    )
    client = sqs_client(settings)
    url = ensure_queue(client, sqs_queue_name(settings, QUEUE), visibility_timeout_seconds=30)
    return Queue(settings, client, url)


def wrapper_env(dispatcher: Dispatcher, queue: Queue, operators_file: Path) -> dict[str, str]:
    """The environment of a wrapper process serving `queue` for `dispatcher`."""
    return {
        "TASKPLAT_WORKER_DISPATCHER_URL": dispatcher.base_url,
        "TASKPLAT_WORKER_TOKEN": WORKER_TOKEN,
        "SQS_ENDPOINT_URL": queue.settings.sqs_endpoint_url or "",
        "AWS_REGION": queue.settings.aws_region,
        "TASKPLAT_SQS_QUEUE_PREFIX": queue.settings.sqs_queue_prefix,
        "TASKPLAT_WORKER_QUEUE": QUEUE,
        "TASKPLAT_WORKER_OPERATORS_FILE": str(operators_file),
        "TASKPLAT_WORKER_WAIT_TIME_SECONDS": "1",
        "TASKPLAT_WORKER_KILL_GRACE_SECONDS": "0.5",
        "TASKPLAT_WORKER_HEARTBEAT_MIN_INTERVAL_SECONDS": "0.2",
        "TASKPLAT_WORKER_RETRY_MAX_SECONDS": "1",
        # The wake-ups these tests send are the wrapper's only way to its tasks (test_claim_poll
        # turns the dispatcher poll on).
        "TASKPLAT_WORKER_POLL_DISPATCHER": "false",
        "TASKPLAT_LOG_LEVEL": "INFO",
    }


def wrapper_settings(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, **overrides: Any
) -> WrapperSettings:
    """The settings `wrapper_env` gives a wrapper process, for an in-process wrapper."""
    values: dict[str, Any] = {
        "dispatcher_url": dispatcher.base_url,
        "worker_token": WORKER_TOKEN,
        "sqs_endpoint_url": queue.settings.sqs_endpoint_url,
        "aws_region": queue.settings.aws_region,
        "sqs_queue_prefix": queue.settings.sqs_queue_prefix,
        "queue": QUEUE,
        "operators_file": operators_file,
        "wait_time_seconds": 1,
        "kill_grace_seconds": 0.5,
        "heartbeat_min_interval_seconds": 0.2,
        "retry_max_seconds": 1.0,
        "drain_timeout_seconds": 5.0,
        "poll_dispatcher": False,
    }
    values.update(overrides)
    return WrapperSettings(**values)


class InProcessWrapper:
    """A wrapper running on its own event loop in a thread; `stop()` drains it like SIGTERM."""

    def __init__(self, settings: WrapperSettings, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.specs = load_operators(settings.operators_file)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.wrapper: WorkerWrapper | None = None
        self._thread = threading.Thread(target=self._main, name="wrapper", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.wrapper = build_wrapper(
            self.settings, self.specs, environ={}, telemetry=self.telemetry
        )
        self._ready.set()
        try:
            await self.wrapper.run(self._stop)
        finally:
            await self.wrapper.aclose()

    def start(self) -> InProcessWrapper:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 30) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the wrapper did not stop"
        if self._error is not None:
            raise self._error


@contextmanager
def running_wrapper(
    dispatcher: Dispatcher,
    queue: Queue,
    operators_file: Path,
    telemetry: Telemetry,
    **overrides: Any,
) -> Iterator[InProcessWrapper]:
    """An in-process wrapper with `wrapper_settings(...)` and `overrides`, stopped on exit."""
    settings = wrapper_settings(dispatcher, queue, operators_file, **overrides)
    wrapper = InProcessWrapper(settings, telemetry).start()
    try:
        yield wrapper
    finally:
        wrapper.stop()


def spawn_wrapper(env: Mapping[str, str], log_dir: Path) -> Child:
    return spawn(
        "wrapper",
        [sys.executable, "-m", "taskplat.worker_wrapper"],
        log_path=log_dir / "wrapper.log",
        env=env,
        die_with_parent=True,
        death_signal=signal.SIGKILL,
    )


def task_event_count(db_url: str, task_id: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM task_events WHERE task_id = %s", (task_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])
