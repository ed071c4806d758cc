"""W3 (recovery): kill -9 the worker wrapper running a long task, `kill_after` seconds into
it, and measure how long until the task's next attempt starts, and that it completes once.

Invariants:
- The wrapper killed is the one the task's first attempt names (`worker_id` is
  `<service>.<generation>`, set by the stack's supervisor); its operator process is found among
  that wrapper's children before the kill, and must be gone (PR_SET_PDEATHSIG) within
  `OPERATOR_DEATH_SECONDS` after it.
- Recovery = the second attempt's `started_at` (the dispatcher's claim, database clock) minus
  the client's `time.time()` at the kill: one machine, one clock. The operator's own start of
  the second run is reported beside it.
- The task is created with `backoff_base_seconds: 0`, so the figure measures the platform's
  detection and re-delivery, not a retry backoff the task asked for.
- The run ends only once the supervisor restarted the killed wrapper and it is healthy, so the
  next run again has every wrapper.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
from tqdm import tqdm

from taskplat.bench.client import BenchError
from taskplat.bench.harness import OPERATORS_SCRIPT, BenchStack
from taskplat.bench.probes import cmdline, process_gone, process_tree
from taskplat.devstack.waiting import wait_for

OPERATOR_DEATH_SECONDS = 5.0
POLL_SECONDS = 0.02


def _create_sleep_task(bs: BenchStack, seconds: float) -> str:
    body = {
        "operator": "sleep",
        "config": {"seconds": seconds},
        "max_attempts": 3,
        "backoff_base_seconds": 0,
    }
    response = httpx.post(f"{bs.dispatcher_url}/tasks", json=body, headers=bs.headers, timeout=10.0)
    if response.status_code != 201:
        raise BenchError(f"W3: POST /tasks answered {response.status_code}: {response.text}")
    return str(response.json()["task_id"])


def _attempt(bs: BenchStack, task_id: str, number: int) -> dict[str, Any] | None:
    for row in bs.query("attempts_of", task_id=task_id):
        if row["attempt"] == number:
            return row
    return None


def _operator_pid(wrapper_pid: int) -> int | None:
    for pid in process_tree(wrapper_pid)[1:]:
        argv = cmdline(pid)
        if OPERATORS_SCRIPT in argv and "sleep" in argv:
            return pid
    return None


def measure_recovery(
    bs: BenchStack, *, sleep_seconds: float, kill_after: float, label: str
) -> dict[str, Any]:
    ttl = bs.lease_ttl
    bs.wait_idle(in_flight_ok=True)
    stack = bs.running()
    expected = round(kill_after + ttl + sleep_seconds + 5)
    with tqdm(total=expected, desc=label, unit="s", leave=False, disable=None) as bar:
        began = time.monotonic()

        def tick() -> None:
            bar.update(min(round(time.monotonic() - began), expected) - bar.n)

        def waiting(what: str, check: Any, timeout: float) -> Any:
            bar.set_postfix_str(what)

            def probe() -> Any:
                tick()
                return check()

            return wait_for(probe, timeout=timeout, what=f"{label}: {what}", interval=POLL_SECONDS)

        task_id = _create_sleep_task(bs, sleep_seconds)
        first = waiting("first attempt", lambda: _attempt(bs, task_id, 1), 60.0)
        service = str(first["worker_id"]).rsplit(".", 1)[0]
        wrapper_pid = stack.pids().get(service)
        if wrapper_pid is None:
            raise BenchError(f"{label}: the wrapper {service} of attempt 1 does not run")
        operator_pid = waiting("operator process", lambda: _operator_pid(wrapper_pid), 10.0)
        kill_at = float(first["started"]) + kill_after
        waiting("the kill", lambda: time.time() >= kill_at, kill_after + 10)
        killed_at = time.time()
        stack.kill(service, signal.SIGKILL)
        try:
            waiting("the operator's death", lambda: process_gone(operator_pid), 5.0)
            operator_died = True
        except TimeoutError:
            operator_died = False
        second = waiting("attempt 2", lambda: _attempt(bs, task_id, 2), ttl + 60)
        recovery = float(second["started"]) - killed_at
        waiting(
            "completion",
            lambda: (
                bs.one("task_state", task_id=task_id)["status"] in ("Completed", "Dead", "Canceled")
            ),
            sleep_seconds + 60,
        )
        stack.wait_running(service, timeout=60, not_pid=wrapper_pid)
        bs.wait_workers_ready()
        bar.update(expected - bar.n)
    state = bs.one("task_state", task_id=task_id)
    attempts = bs.query("attempts_of", task_id=task_id)
    completed = [row for row in attempts if row["outcome"] == "Completed"]
    result = state["result"] or {}
    restarted = result.get("started")
    return {
        "lease_ttl_seconds": ttl,
        "recovery_seconds": round(recovery, 3),
        "operator_restart_seconds": (
            round(float(restarted) - killed_at, 3) if restarted is not None else None
        ),
        "completed_once": state["status"] == "Completed" and len(completed) == 1,
        "operator_died_with_wrapper": operator_died,
        "attempts": len(attempts),
        "first_attempt_outcome": attempts[0]["outcome"] if attempts else None,
        "status": state["status"],
    }
