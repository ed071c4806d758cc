"""Receive visibility: a wake-up taken by a dead wrapper's open long poll comes back within
seconds, and a running task's message stays hidden past the receive's short timeout."""

from __future__ import annotations

from pathlib import Path

from test_wrapper import running_wrapper
from wrapper_harness import Dispatcher, Queue, spawn_wrapper, wait_gone, wrapper_env

from taskplat.devstack.waiting import wait_for


def test_a_wake_up_taken_by_a_dead_wrappers_open_poll_comes_back_within_seconds(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    env = wrapper_env(dispatcher, queue, operators_file)
    env["TASKPLAT_WORKER_WAIT_TIME_SECONDS"] = "20"  # its long poll outlives it
    env["TASKPLAT_WORKER_VISIBILITY_TIMEOUT_SECONDS"] = "60"
    first = dispatcher.create("echo", config={"n": 1})
    wrapper = spawn_wrapper(env, tmp_path)
    try:
        queue.wake(first["task_id"])
        dispatcher.wait_status(first["task_id"], "Completed", timeout=30)
        queue.wait_empty()
        # The wrapper is long-polling again; it dies with that poll open.
        wrapper.popen.kill()
        assert wait_gone(wrapper.popen.pid)
    finally:
        wrapper.stop_group(timeout=5)
    task = dispatcher.create("echo", config={"n": 2})
    queue.wake(task["task_id"])
    # The dead wrapper's poll took the wake-up: received by nobody, hidden.
    wait_for(
        lambda: queue.visible() == 0 and queue.in_flight() == 1,
        timeout=5,
        what="the dead wrapper's open poll to take the wake-up",
    )
    with running_wrapper(dispatcher, queue, operators_file):
        # Hidden for the receive's short timeout only, not the 60 s visibility timeout.
        done = dispatcher.wait_status(task["task_id"], "Completed", timeout=10)
        queue.wait_empty()
    assert len(done["attempts"]) == 1


def test_a_running_tasks_message_stays_hidden_past_the_short_receive_timeout(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    task = dispatcher.create("sleep", config={"seconds": 3})
    queue.wake(task["task_id"])
    settings = {
        "concurrency": 1,
        "receive_visibility_timeout_seconds": 1,
        "visibility_timeout_seconds": 30,
        "visibility_extension_seconds": 20,  # only the first, early renewal can keep it hidden
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
