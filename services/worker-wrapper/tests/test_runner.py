"""Operator runner tests with real child processes (no dispatcher, no SQS)."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from wrapper_harness import wait_gone

from taskplat.common.contracts import Event
from taskplat.worker_wrapper.operators import OperatorSpec
from taskplat.worker_wrapper.outcomes import (
    Abort,
    Failed,
    RunOutcome,
    Stopped,
    Succeeded,
    TaskInput,
)
from taskplat.worker_wrapper.pool import PooledRunner, warm_operators
from taskplat.worker_wrapper.protocol import StdoutLimits
from taskplat.worker_wrapper.runner import PerTaskRunner, RunnerLimits

OPERATORS = Path(__file__).with_name("wrapper_operators.py")
SECRET = "worker-token-that-must-not-leak-0123"
LIMITS = RunnerLimits(
    stdout=StdoutLimits(line_max_bytes=4096, total_max_bytes=64 * 1024),
    stderr_tail_bytes=512,
    kill_grace_seconds=0.5,
)
ENVIRON = {"ALLOWED_VAR": "yes", "OTHER_VAR": "no", "TASKPLAT_WORKER_TOKEN": SECRET}
T = TypeVar("T")


def spec(behaviour: str, **fields: Any) -> OperatorSpec:
    return OperatorSpec(command=["{python}", str(OPERATORS), behaviour], **fields)


def task(config: dict[str, Any] | None = None, attempt: int = 1) -> TaskInput:
    task_id = str(uuid.uuid4())
    document = {
        "task_id": task_id,
        "attempt": attempt,
        "operator": "test",
        "queue": "default",
        "config": config or {},
        "inputs": [],
        "job": None,
        "timeout_seconds": None,
        "lease_token": str(uuid.uuid4()),
        "deadline_at": None,
    }
    return TaskInput(document, {"TASKPLAT_TASK_ID": task_id, "TASKPLAT_ATTEMPT": str(attempt)})


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, events: Sequence[Event]) -> None:
        self.events.extend(events)


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


async def run_one(
    runner: PerTaskRunner | PooledRunner,
    task_input: TaskInput,
    *,
    timeout: float | None = 20.0,
    sink: Sink | None = None,
    abort: Abort | None = None,
) -> RunOutcome:
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    return await runner.run(
        task_input, deadline=deadline, forward=sink or Sink(), abort=abort or Abort()
    )


def per_task(behaviour: str, **fields: Any) -> PerTaskRunner:
    return PerTaskRunner("test", spec(behaviour, **fields), LIMITS, ENVIRON)


def test_envelope_success_forwards_events_in_order() -> None:
    sink = Sink()
    outcome = run(lambda: run_one(per_task("events"), task({"count": 5}), sink=sink))
    assert outcome == Succeeded({"emitted": 5}, (), ())
    assert [event.cursor for event in sink.events] == [0, 1, 2, 3, 4]


def test_example_echo_returns_config() -> None:
    echo = OperatorSpec(command=["{python}", "-m", "taskplat.worker_wrapper.examples.echo"])
    runner = PerTaskRunner("echo", echo, LIMITS, {})
    outcome = run(lambda: run_one(runner, task({"hello": "world"})))
    assert outcome == Succeeded({"hello": "world"}, (), ())


def test_failure_status_is_a_failure() -> None:
    outcome = run(lambda: run_one(per_task("failed"), task()))
    assert isinstance(outcome, Failed)
    assert "operator reported status 'failed': nope" in outcome.error_message


def test_a_permanent_failure_is_not_retryable() -> None:
    outcome = run(lambda: run_one(per_task("permanent"), task()))
    assert isinstance(outcome, Failed) and outcome.retryable is False
    assert "never again" in outcome.error_message
    plain = run(lambda: run_one(per_task("failed"), task()))
    assert isinstance(plain, Failed) and plain.retryable is True


def test_example_fail_fails_until_times() -> None:
    fail = OperatorSpec(command=["{python}", "-m", "taskplat.worker_wrapper.examples.fail"])
    runner = PerTaskRunner("fail", fail, LIMITS, {})
    first = run(lambda: run_one(runner, task({"times": 1}, attempt=1)))
    second = run(lambda: run_one(runner, task({"times": 1}, attempt=2)))
    assert isinstance(first, Failed) and "failing on purpose" in first.error_message
    assert second == Succeeded({"attempt": 2}, (), ())


def test_nonzero_exit_carries_the_stderr_tail() -> None:
    outcome = run(lambda: run_one(per_task("crash"), task()))
    assert isinstance(outcome, Failed)
    assert "exited with code 3 without a result envelope" in outcome.error_message
    assert outcome.error_message.rstrip().endswith("the real reason")
    assert len(outcome.error_message) < 512 + 200  # the tail is capped


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        ("garbage", "exited with code 0 without a result envelope"),
        ("exit-early", "exited with code 0 without a result envelope"),
        ("bad-envelope", "invalid result envelope: payload"),
    ],
)
def test_garbage_or_missing_envelope_fails(behaviour: str, expected: str) -> None:
    outcome = run(lambda: run_one(per_task(behaviour), task()))
    assert isinstance(outcome, Failed)
    assert expected in outcome.error_message


@pytest.mark.parametrize("behaviour", ["flood-line", "flood-total"])
def test_stdout_flood_kills_the_operator(behaviour: str) -> None:
    started = time.monotonic()
    outcome = run(lambda: run_one(per_task(behaviour), task(), timeout=30))
    assert isinstance(outcome, Failed)
    assert "stdout flood" in outcome.error_message
    assert time.monotonic() - started < 10


def test_deadline_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    outcome = run(lambda: run_one(per_task("hang"), task({"pid_file": str(pid_file)}), timeout=1.5))
    assert isinstance(outcome, Failed)
    assert "deadline exceeded after" in outcome.error_message
    grandchild = int(pid_file.read_text())
    assert wait_gone(grandchild), "the operator's grandchild outlived the deadline kill"


def test_kill_escalates_to_sigkill(tmp_path: Path) -> None:
    pid_file = tmp_path / "stubborn.pid"
    outcome = run(
        lambda: run_one(per_task("stubborn"), task({"pid_file": str(pid_file)}), timeout=1.0)
    )
    assert isinstance(outcome, Failed) and "deadline exceeded" in outcome.error_message
    assert wait_gone(int(pid_file.read_text()))


def test_stop_kills_the_operator_and_reports_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"

    async def main() -> RunOutcome:
        abort = Abort()
        running = asyncio.ensure_future(
            run_one(per_task("hang"), task({"pid_file": str(pid_file)}), abort=abort)
        )
        give_up = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < give_up, "the operator did not start"
            await asyncio.sleep(0.02)
        abort.trigger("canceled", "the task was canceled")
        return await running

    outcome = run(main)
    assert outcome == Stopped("canceled", "the task was canceled")
    assert wait_gone(int(pid_file.read_text()))


def test_environment_is_the_allow_list_only() -> None:
    runner = per_task("env", env=("ALLOWED_VAR", "MISSING_VAR"))
    outcome = run(lambda: run_one(runner, task()))
    assert isinstance(outcome, Succeeded) and outcome.payload is not None
    env = outcome.payload["env"]
    assert env["ALLOWED_VAR"] == "yes"
    assert env["TASKPLAT_OPERATOR"] == "test"
    assert env["TASKPLAT_OPERATOR_MODE"] == "per-task"
    assert env["TASKPLAT_ATTEMPT"] == "1"
    assert "OTHER_VAR" not in env and "MISSING_VAR" not in env
    assert SECRET not in repr(env)


def test_the_platform_urls_reach_every_operator_without_an_allow_list() -> None:
    environ = {**ENVIRON, "TASKPLAT_QUERY_URL": "http://query:8092"}
    runner = PerTaskRunner("test", spec("env"), LIMITS, environ)
    outcome = run(lambda: run_one(runner, task()))
    assert isinstance(outcome, Succeeded) and outcome.payload is not None
    env = outcome.payload["env"]
    assert env["TASKPLAT_QUERY_URL"] == "http://query:8092"
    assert "TASKPLAT_CREDENTIALS_URL" not in env and "ALLOWED_VAR" not in env
    assert SECRET not in repr(env)


def test_allow_list_cannot_name_the_worker_token() -> None:
    with pytest.raises(ValueError, match="never passed to an operator"):
        spec("env", env=("TASKPLAT_WORKER_TOKEN",))


def test_unstartable_command_fails_cleanly() -> None:
    missing = OperatorSpec(command=["/nonexistent/operator"])
    outcome = run(lambda: run_one(PerTaskRunner("missing", missing, LIMITS, {}), task()))
    assert (
        isinstance(outcome, Failed) and "cannot start operator 'missing'" in outcome.error_message
    )


def test_pooled_serves_several_tasks_with_one_process() -> None:
    async def main() -> list[RunOutcome]:
        runner = PooledRunner("pid", spec("pid", mode="pooled"), LIMITS, ENVIRON)
        try:
            outcomes = [await run_one(runner, task()) for _ in range(3)]
            assert runner.started == 1
            return outcomes
        finally:
            await runner.close()

    outcomes = run(main)
    pids = {o.payload["pid"] for o in outcomes if isinstance(o, Succeeded) and o.payload}
    assert len(pids) == 1 and len(outcomes) == 3
    assert wait_gone(pids.pop()), "close() left the pooled process running"


def test_pooled_process_is_recycled_after_a_crash_and_a_hang() -> None:
    async def main() -> None:
        runner = PooledRunner("pid", spec("pid", mode="pooled"), LIMITS, ENVIRON)
        try:
            first = await run_one(runner, task())
            crashed = await run_one(runner, task({"action": "crash"}))
            second = await run_one(runner, task())
            hung = await run_one(runner, task({"action": "hang"}), timeout=1.0)
            third = await run_one(runner, task())
            failed = await run_one(runner, task({"action": "fail"}))
            fourth = await run_one(runner, task())
        finally:
            await runner.close()
        assert isinstance(first, Succeeded) and isinstance(second, Succeeded)
        assert isinstance(third, Succeeded) and isinstance(fourth, Succeeded)
        assert isinstance(crashed, Failed)
        assert "exited with code 7 before answering" in crashed.error_message
        assert "pooled crash" in crashed.error_message
        assert isinstance(hung, Failed) and "deadline exceeded" in hung.error_message
        assert isinstance(failed, Failed) and "RuntimeError: asked to fail" in failed.error_message
        pids = [o.payload["pid"] for o in (first, second, third, fourth) if o.payload]
        assert pids[0] != pids[1] != pids[2] and pids[2] == pids[3]  # a failure status keeps it
        assert runner.started == 3
        assert wait_gone(pids[0]) and wait_gone(pids[1])

    run(main)


def test_pooled_runs_pool_size_tasks_at_once() -> None:
    async def main() -> None:
        runner = PooledRunner("pid", spec("pid", mode="pooled", pool_size=2), LIMITS, ENVIRON)
        try:
            outcomes = await asyncio.gather(*(run_one(runner, task()) for _ in range(4)))
        finally:
            await runner.close()
        assert all(isinstance(o, Succeeded) for o in outcomes)
        assert runner.started == 2

    run(main)


def test_pooled_reuses_an_idle_process_before_starting_another() -> None:
    async def main() -> list[RunOutcome]:
        pooled = spec("pid", mode="pooled", pool_size=4, warm_processes=0)
        runner = PooledRunner("pid", pooled, LIMITS, ENVIRON)
        try:
            outcomes = [await run_one(runner, task()) for _ in range(5)]
            assert runner.started == 1, "one task at a time needs one process"
            return outcomes
        finally:
            await runner.close()

    pids = {o.payload["pid"] for o in run(main) if isinstance(o, Succeeded) and o.payload}
    assert len(pids) == 1


def test_warm_starts_the_pool_before_any_task() -> None:
    async def main() -> None:
        pooled = spec("pid", mode="pooled", pool_size=3)
        runner = PooledRunner("pid", pooled, LIMITS, ENVIRON)
        lazy = PooledRunner(
            "pid", spec("pid", mode="pooled", pool_size=3, warm_processes=1), LIMITS, ENVIRON
        )
        try:
            await warm_operators([runner, lazy, per_task("pid")])
            assert (runner.started, lazy.started) == (3, 1)
            outcomes = await asyncio.gather(*(run_one(runner, task()) for _ in range(3)))
            assert all(isinstance(o, Succeeded) for o in outcomes)
            assert runner.started == 3, "the tasks ran on the warm processes"
            assert isinstance(await run_one(lazy, task()), Succeeded) and lazy.started == 1
        finally:
            await runner.close()
            await lazy.close()

    run(main)


def test_warm_processes_is_checked() -> None:
    with pytest.raises(ValueError, match="larger than pool_size"):
        spec("pid", mode="pooled", pool_size=2, warm_processes=3)
    with pytest.raises(ValueError, match="pooled operators only"):
        spec("pid", warm_processes=1)


def test_pooled_events_are_forwarded_in_order() -> None:
    async def main() -> None:
        runner = PooledRunner("events", spec("events", mode="pooled"), LIMITS, ENVIRON)
        sink = Sink()
        try:
            await run_one(runner, task({"count": 4}), sink=sink)
            await run_one(runner, task({"count": 3}), sink=sink)
        finally:
            await runner.close()
        assert [event.cursor for event in sink.events] == [0, 1, 2, 3, 0, 1, 2]

    run(main)


def test_operator_runs_with_the_wrappers_interpreter() -> None:
    assert spec("env").argv()[0] == sys.executable
