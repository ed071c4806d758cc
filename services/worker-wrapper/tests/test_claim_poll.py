"""The wrapper's waiting claim (`poll_dispatcher`): a task created while the wrapper idles is
claimed for it at once with no SQS message, never more tasks than slots run, wake-ups still work
beside it, and a stop ends the open poll at once (the dispatcher claims nothing more for the
stopped wrapper) and drains what was already brought."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from test_wrapper import parse_time, running_wrapper
from wrapper_harness import Dispatcher, Queue, run_dispatcher, spawn_wrapper, wrapper_env

from taskplat.common.tokens.keys import private_key_pem
from taskplat.devstack.waiting import wait_for

POLL = {"poll_dispatcher": True, "poll_wait_seconds": 5.0}


def _most_at_once(attempts: list[dict[str, str]]) -> int:
    """The most attempts that ran at the same time, from their start and finish times."""
    edges = sorted(
        [(parse_time(a["started_at"]), 1) for a in attempts]
        + [(parse_time(a["finished_at"]), -1) for a in attempts]
    )
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_a_task_created_while_the_wrapper_idles_runs_without_a_wake_up(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    with running_wrapper(dispatcher, queue, operators_file, **POLL):
        wait_for(
            lambda: "taskplat_claims_waiting{" in dispatcher.api.get("/metrics").text,
            timeout=15,
            what="the wrapper's waiting claim",
        )
        task = dispatcher.create("echo", config={"n": 1})  # no wake-up is ever sent
        done = dispatcher.wait_status(task["task_id"], "Completed", timeout=15)
    assert done["result"] == {"n": 1}
    assert queue.in_flight() == 0


def test_polls_never_run_more_tasks_than_slots_and_wake_ups_still_work(
    dispatcher: Dispatcher, queue: Queue, operators_file: Path
) -> None:
    # Slots held until each outcome is reported, so the dispatcher's times show them.
    settings = {"concurrency": 2, "report_in_background": False, **POLL}
    with running_wrapper(dispatcher, queue, operators_file, **settings):
        tasks = [dispatcher.create("sleep", config={"seconds": 1.0}) for _ in range(5)]
        ids = [task["task_id"] for task in tasks]
        for task_id in ids:  # stale or not, each wake-up is answered and deleted
            queue.wake(task_id)
        done = [dispatcher.wait_status(task_id, "Completed", timeout=30) for task_id in ids]
        queue.wait_empty()
    attempts = [attempt for task in done for attempt in task["attempts"]]
    most = _most_at_once(attempts)
    assert 1 <= most <= 2


def _waiting_claims(dispatcher: Dispatcher) -> float:
    """`taskplat_claims_waiting` summed over queues (0 when not reported)."""
    text = dispatcher.api.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("taskplat_claims_waiting{")
    )


def test_a_stop_ends_the_open_poll_at_once_and_leaves_no_claim_behind(
    db_url: str, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    # The poll may wait a minute; the stop must not wait for it, nor leave it open.
    with run_dispatcher(
        db_url, tmp_path / "dispatcher", {"TASKPLAT_DISPATCHER_CLAIM_MAX_WAIT_SECONDS": "60"}
    ) as dispatcher:
        env = wrapper_env(dispatcher, queue, operators_file)
        env["TASKPLAT_WORKER_POLL_DISPATCHER"] = "true"
        env["TASKPLAT_WORKER_POLL_WAIT_SECONDS"] = "60"
        env["TASKPLAT_WORKER_WORKER_ID"] = "w-stopping"
        wrapper = spawn_wrapper(env, tmp_path)
        try:
            task = dispatcher.create("sleep", config={"seconds": 0.5})
            dispatcher.wait_status(task["task_id"], "Completed", timeout=30)
            wait_for(
                lambda: _waiting_claims(dispatcher) >= 1,
                timeout=15,
                what="the wrapper's next waiting claim",
            )
            wrapper.popen.send_signal(signal.SIGTERM)
            # The dispatcher sees the poll's client leave: no claim of this wrapper waits there.
            wait_for(
                lambda: _waiting_claims(dispatcher) == 0,
                timeout=20,
                what="the waiting claim to end with the stop",
            )
            # Far sooner than the poll's minute: the stop did not wait for it.
            assert wrapper.wait(20), f"the wrapper did not exit:\n{wrapper.tail()}"
            assert wrapper.popen.returncode == 0, wrapper.tail()
        finally:
            wrapper.stop_group(timeout=5)
        assert "claim_poll_cancelled" in wrapper.tail(200)
        assert "worker_wrapper_stopped" in wrapper.tail(200)
        # A task created after the stop is not claimed for the wrapper that is gone.
        later = dispatcher.create("echo", config={"n": 2})
        assert _waiting_claims(dispatcher) == 0
        view = dispatcher.get(later["task_id"])
        assert view["status"] == "Queued" and view["attempts"] == []


def test_the_wrapper_reports_itself_and_its_running_tasks_on_its_polls(
    db_url: str, tmp_path: Path, queue: Queue, operators_file: Path
) -> None:
    every_report = {"TASKPLAT_DISPATCHER_WORKER_REPORT_SECONDS": "0"}
    with run_dispatcher(db_url, tmp_path, every_report) as dispatcher:

        def workers() -> list[dict[str, Any]]:
            listed: list[dict[str, Any]] = dispatcher.api.get("/workers").json()["workers"]
            return listed

        settings = {"concurrency": 2, "report_interval_seconds": 0.2, "worker_id": "w-report"}
        with running_wrapper(dispatcher, queue, operators_file, **POLL, **settings):
            wait_for(workers, timeout=15, what="the wrapper's first report")
            (worker,) = workers()
            assert worker["worker_id"] == "w-report" and worker["state"] == "alive"
            assert worker["slots"] == 2 and worker["queues"] == ["default"]
            assert worker["version"] and worker["running"] == []
            task = dispatcher.create("sleep", config={"seconds": 3.0})
            wait_for(
                lambda: workers()[0]["running"] == [task["task_id"]],
                timeout=15,
                what="the running task in the wrapper's report",
            )
            dispatcher.wait_status(task["task_id"], "Completed", timeout=15)
            wait_for(
                lambda: workers()[0]["running"] == [],
                timeout=15,
                what="the finished task gone from the report",
            )


def test_without_capability_keys_an_untrusted_task_reaches_no_wrapper_by_any_claim(
    db_url: str, queue: Queue, operators_file: Path, tmp_path: Path
) -> None:
    """An untrusted task created while the dispatcher had capability keys, the keys removed and
    the dispatcher restarted: neither its SQS wake-up (claimed by id) nor the waiting claim
    hands it to the wrapper; it stays Queued, no attempt spent, while trusted work runs."""
    untrusted_ops = {"TASKPLAT_DISPATCHER_UNTRUSTED_OPERATORS": "echo"}
    keys = {
        "TASKPLAT_CAPABILITY_TOKEN_KEYS": json.dumps({"c1": private_key_pem(b"\x21" * 32)}),
        "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID": "c1",
    }
    with run_dispatcher(db_url, tmp_path / "keyed", {**untrusted_ops, **keys}) as keyed:
        untrusted = keyed.create("echo", config={"n": 1})
    with run_dispatcher(db_url, tmp_path / "keyless", untrusted_ops) as keyless:
        with running_wrapper(keyless, queue, operators_file, **POLL):
            wait_for(
                lambda: "taskplat_claims_waiting{" in keyless.api.get("/metrics").text,
                timeout=15,
                what="the wrapper's waiting claim",
            )
            queue.wake(untrusted["task_id"])  # claimed by id: NotClaimed, the message deleted
            queue.wait_empty()
            trusted = keyless.create("sleep", config={"seconds": 0.1})  # the waiting claim's
            keyless.wait_status(trusted["task_id"], "Completed", timeout=30)
        view = keyless.get(untrusted["task_id"])
        assert view["status"] == "Queued" and view["attempts"] == []
        refused = [
            line
            for line in keyless.api.get("/metrics").text.splitlines()
            if line.startswith("taskplat_claims_refused_total{")
        ]
        assert refused and float(refused[0].rsplit(" ", 1)[1]) >= 1
