"""The worker wrapper against a real dispatcher process and a real SQS queue."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import SecretStr
from wrapper_harness import (
    Dispatcher,
    InProcessWrapper,
    Queue,
    spawn_wrapper,
    task_event_count,
    wait_gone,
    wrapper_env,
    wrapper_settings,
)

from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.worker_wrapper.dispatcher_client import (
    DispatcherClient,
    DispatcherProtocolError,
    DispatcherUnavailable,
)

DATASET = "00000000-0000-4000-8000-0000000000aa"
VERSION = "00000000-0000-4000-8000-0000000000bb"


@contextmanager
def running_wrapper(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, **overrides: Any
) -> Iterator[InProcessWrapper]:
    wrapper = InProcessWrapper(wrapper_settings(dispatcher, queue, operators_file, **overrides))
    wrapper.start()
    try:
        yield wrapper
    finally:
        wrapper.stop()


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_echo_completes_with_its_config_and_forwards_events(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, db_url: str
) -> None:
    events = [
        {"dataset_uuid": DATASET, "dataset_version": VERSION, "cursor": cursor} for cursor in (1, 2)
    ]
    config = {"greeting": "hello", "events": events}
    task = dispatcher.create("echo", config=config)
    with running_wrapper(dispatcher, queue, operators_file):
        queue.wake(task["task_id"])
        done = dispatcher.wait_status(task["task_id"], "Completed")
        queue.wait_empty()
    assert done["result"] == config
    assert [attempt["outcome"] for attempt in done["attempts"]] == ["Completed"]
    assert task_event_count(db_url, task["task_id"]) == 2


def test_duplicate_wake_ups_run_the_task_once(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    record = tmp_path / "runs.txt"
    task = dispatcher.create("record", config={"path": str(record), "seconds": 1})
    for _ in range(3):
        queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        done = dispatcher.wait_status(task["task_id"], "Completed")
        queue.wait_empty()
        queue.wake(task["task_id"])  # a late duplicate after completion
        queue.wait_empty()
    assert len(done["attempts"]) == 1
    assert record.read_text().splitlines() == [f"{task['task_id']} 1"]


def test_malformed_bodies_are_deleted_and_the_next_task_runs(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    queue.send("not json at all")
    queue.send('{"task_id": "not-a-uuid"}')
    queue.send('{"task_id": "6f1c7a9e-3d2b-4c1a-9e8f-0a1b2c3d4e5f", "extra": 1}')
    task = dispatcher.create("echo", config={"n": 1})
    queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        dispatcher.wait_status(task["task_id"], "Completed")
        queue.wait_empty()


def test_a_result_the_dispatcher_refuses_fails_the_attempt(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    task = dispatcher.create("echo", config={"blob": "x" * 300_000}, max_attempts=1)
    queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        dead = dispatcher.wait_status(task["task_id"], "Dead")
        queue.wait_empty()
    assert "the dispatcher refused the result" in dead["last_error"]
    assert "cap" in dead["last_error"]


def test_unknown_operator_fails_the_task(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    task = dispatcher.create("no-such-operator", max_attempts=1)
    queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        dead = dispatcher.wait_status(task["task_id"], "Dead")
        queue.wait_empty()
    assert "unknown operator 'no-such-operator'" in dead["last_error"]


def test_deadline_kills_the_operator_and_fails_the_task(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    task = dispatcher.create(
        "hang", config={"pid_file": str(pid_file)}, timeout_seconds=1, max_attempts=1
    )
    queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        dead = dispatcher.wait_status(task["task_id"], "Dead")
        queue.wait_empty()
    assert "deadline exceeded" in dead["last_error"]
    assert wait_gone(int(pid_file.read_text()))


def test_crash_fails_the_task_with_the_stderr_tail(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    task = dispatcher.create("crash", max_attempts=2)
    queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        failed = dispatcher.wait_status(task["task_id"], "Failed")
        queue.wait_empty()
    assert "exited with code 3" in failed["last_error"]
    assert "the real reason" in failed["last_error"]
    assert failed["next_retry_at"] is not None


def grandchild_pid(pid_file: Path) -> int:
    def read() -> str:
        return pid_file.read_text().strip() if pid_file.exists() else ""

    return int(wait_for(read, timeout=10, what="the operator to start its grandchild"))


def test_cancel_while_running_stops_the_operator(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path, db_url: str
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    task = dispatcher.create("hang", config={"pid_file": str(pid_file), "emit": True})
    queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        grandchild = grandchild_pid(pid_file)
        # The event line was forwarded at once, while the operator still runs.
        wait_for(lambda: task_event_count(db_url, task["task_id"]) == 1, timeout=5, what="event")
        assert dispatcher.get(task["task_id"])["status"] == "Running"
        dispatcher.cancel(task["task_id"])
        queue.wait_empty(timeout=10)  # the heartbeat learnt it, the wrapper reported and deleted
        assert wait_gone(grandchild)
    assert dispatcher.get(task["task_id"])["status"] == "Canceled"


def test_lost_lease_stops_the_operator_and_reports_nothing(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path, db_url: str
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    task = dispatcher.create("hang", config={"pid_file": str(pid_file)})
    queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file):
        grandchild = grandchild_pid(pid_file)
        with psycopg.connect(db_url, autocommit=True) as conn:  # another holder took the lease
            conn.execute(
                "UPDATE tasks SET lease_token = gen_random_uuid() WHERE task_id = %s",
                (task["task_id"],),
            )
        queue.wait_empty(timeout=10)
        assert wait_gone(grandchild)
    after = dispatcher.get(task["task_id"])
    assert after["status"] == "Running" and after["attempts"][0]["outcome"] is None


def test_visibility_is_extended_while_the_task_runs(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    task = dispatcher.create("sleep", config={"seconds": 3.5})
    queue.wake(task["task_id"])
    settings = {
        "concurrency": 1,
        "visibility_timeout_seconds": 2,
        "visibility_extension_seconds": 0.5,
    }
    with running_wrapper(dispatcher, queue, operators_file, **settings):
        dispatcher.wait_status(task["task_id"], "Running")
        # With its one slot busy the wrapper receives nothing: a lapsed visibility would show.
        while dispatcher.get(task["task_id"])["status"] == "Running":
            assert queue.visible() == 0, "the message became visible while its task ran"
            wait_for(lambda: True, timeout=0.2, what="a pause")
        done = dispatcher.wait_status(task["task_id"], "Completed")
        queue.wait_empty()
    assert len(done["attempts"]) == 1


def test_dispatcher_client_gives_up_and_never_takes_a_401_for_a_rejection(
    dispatcher: Dispatcher,
) -> None:
    async def main() -> None:
        unreachable = DispatcherClient(f"http://127.0.0.1:{free_port()}", SecretStr("x" * 16))
        wrong_token = DispatcherClient(dispatcher.base_url, SecretStr("wrong-token-0123456789"))
        loop = asyncio.get_running_loop()
        try:
            with pytest.raises(DispatcherUnavailable, match="gave up"):
                await unreachable.claim(uuid.uuid4(), "w", until=loop.time() + 0.5)
            with pytest.raises(DispatcherProtocolError) as refused:
                await wrong_token.claim(uuid.uuid4(), "w", until=loop.time() + 0.5)
            assert refused.value.status_code == 401
        finally:
            await unreachable.aclose()
            await wrong_token.aclose()

    asyncio.run(main())


def test_concurrency_runs_that_many_tasks_at_once(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    tasks = [dispatcher.create("sleep", config={"seconds": 1.5}) for _ in range(3)]
    for task in tasks:
        queue.wake(task["task_id"])
    with running_wrapper(dispatcher, queue, operators_file, concurrency=3):
        done = [dispatcher.wait_status(t["task_id"], "Completed") for t in tasks]
        queue.wait_empty()
    attempts = [task["attempts"][0] for task in done]
    latest_start = max(parse_time(a["started_at"]) for a in attempts)
    earliest_end = min(parse_time(a["finished_at"]) for a in attempts)
    assert latest_start < earliest_end, "the three sleeps did not overlap"


def test_sigterm_drains_then_reports_the_rest_for_an_immediate_retry(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    short = dispatcher.create("sleep", config={"seconds": 1})
    # Its last attempt: a drained attempt is not the task's fault and must not kill it.
    long = dispatcher.create("sleep", config={"seconds": 120}, max_attempts=1)
    env = wrapper_env(dispatcher, queue, operators_file)
    env["TASKPLAT_WORKER_DRAIN_TIMEOUT_SECONDS"] = "4"
    wrapper = spawn_wrapper(env, tmp_path)
    try:
        queue.wake(short["task_id"])
        queue.wake(long["task_id"])
        dispatcher.wait_status(short["task_id"], "Running", timeout=30)
        dispatcher.wait_status(long["task_id"], "Running", timeout=30)
        wrapper.popen.send_signal(signal.SIGTERM)
        assert wrapper.wait(20), f"the wrapper did not exit:\n{wrapper.tail()}"
        assert wrapper.popen.returncode == 0, wrapper.tail()
    finally:
        wrapper.stop_group(timeout=5)
    assert dispatcher.get(short["task_id"])["status"] == "Completed"
    failed = dispatcher.get(long["task_id"])
    assert failed["status"] == "Failed"
    assert "shutting down" in failed["last_error"]
    assert failed["attempts"][-1]["outcome"] == "Drained"
    assert (failed["counted_attempts"], failed["processing_attempts"]) == (0, 1)
    retry_in = (parse_time(failed["next_retry_at"]) - datetime.now(UTC)).total_seconds()
    assert retry_in < 1, f"the retry is {retry_in:.1f}s away, not immediate"
    queue.wait_empty()
    assert "worker_wrapper_stopped" in wrapper.tail(200)


def test_wrapper_process_serves_with_the_default_operators(
    dispatcher: Dispatcher, queue: Queue, tmp_path: Path
) -> None:
    env = wrapper_env(dispatcher, queue, Path("unused"))
    del env["TASKPLAT_WORKER_OPERATORS_FILE"]
    task = dispatcher.create("fail", config={"times": 0})
    wrapper = spawn_wrapper(env, tmp_path)
    try:
        queue.wake(task["task_id"])
        done = dispatcher.wait_status(task["task_id"], "Completed", timeout=30)
        queue.wait_empty()
    finally:
        wrapper.stop_group(timeout=10)
    assert done["result"] == {"attempt": 1}


def test_an_idle_wrapper_exits_soon_after_sigterm(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    # The stop waits for the SQS receive in flight (1 s here); once stopped, the process ends
    # without the interpreter's teardown (`taskplat.common.process_exit`), which kept it 0.4 s
    # (quiet machine) to 3 s (busy one) after `worker_wrapper_stopped`.
    wrapper = spawn_wrapper(wrapper_env(dispatcher, queue, operators_file), tmp_path)
    try:
        wait_for(
            lambda: "worker_wrapper_started" in wrapper.tail(50),
            timeout=30,
            what="the wrapper to start",
        )
        asked = time.monotonic()
        wrapper.popen.send_signal(signal.SIGTERM)
        assert wrapper.wait(20), f"the wrapper did not exit:\n{wrapper.tail()}"
        took = time.monotonic() - asked
        gone = datetime.now(UTC)
        assert wrapper.popen.returncode == 0, wrapper.tail()
    finally:
        wrapper.stop_group(timeout=5)
    stopped = [
        json.loads(line)["timestamp"]
        for line in wrapper.tail(50).splitlines()
        if "worker_wrapper_stopped" in line
    ]
    assert stopped, wrapper.tail(20)
    lingered = (gone - parse_time(stopped[0])).total_seconds()
    assert lingered < 1.0, f"the wrapper lingered {lingered:.2f}s after it stopped"
    assert took < 3.0, f"the idle wrapper took {took:.1f}s to exit:\n{wrapper.tail(20)}"
