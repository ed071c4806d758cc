"""``python -m taskplat.bench.missing_queue``: what a queue with no SQS queue behind it costs.

A private bench stack (`BenchStack`: Postgres, LocalStack, every service, one worker wrapper);
a queue is registered (`PUT /queues/{queue}`) and never created in SQS; `--tasks` tasks are
created on it; once the relay holds it (`GET /queues/{queue}` shows `sqs.state` `missing`) the
relay's CPU (its process tree, from /proc), LocalStack's and the scheduler's are measured over
`--seconds`, with the relay's SQS calls (its probes) and the wake-ups written meanwhile. Then a
few tasks on the stack's own queue must complete (the rest of the platform works), and the SQS
queue is created: the time until every wake-up of the held queue left the outbox is reported.

Invariants: it asserts nothing about speed (a figure, reported, is for the reader to judge; the
target is a tenth of a core for the relay); it fails (exit 1) only when the stack misbehaves:
the queue never held, the relay's calls not bounded, the other queue's tasks not completed, or
the wake-ups not sent once the SQS queue exists. The machine's load is printed beside the
figures: a busy machine slows every process, so read the figures with it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from taskplat.bench.client import BenchError
from taskplat.bench.config import BASE_ENV
from taskplat.bench.harness import BenchStack
from taskplat.bench.probes import cpu_snapshot, cpu_split, scrape
from taskplat.devstack.sqs import sqs_client
from taskplat.devstack.waiting import wait_for

QUEUE = "nosqs"
BATCH = 100


def _say(text: str) -> None:
    print(f"missing-queue: {text}", flush=True)


def _api(stack: BenchStack, method: str, path: str, **kwargs: Any) -> Any:
    response = httpx.request(
        method, f"{stack.dispatcher_url}{path}", headers=stack.headers, timeout=30, **kwargs
    )
    if response.status_code >= 300:
        raise BenchError(f"{method} {path}: {response.status_code} {response.text[:300]}")
    return response.json()


def _create(stack: BenchStack, queue: str, count: int, operator: str = "noop") -> list[str]:
    ids: list[str] = []
    for start in range(0, count, BATCH):
        size = min(BATCH, count - start)
        body = {"tasks": [{"operator": operator, "queue": queue} for _ in range(size)]}
        answer = _api(stack, "POST", "/tasks/batch", json=body)
        ids += [str(item["task"]["task_id"]) for item in answer["results"]]
    return ids


def _relay_requests(stack: BenchStack) -> dict[str, float]:
    """The relay's SQS calls so far by operation (`send_message_batch`, `get_queue_url`, ...)."""
    samples = scrape(stack.running().ops_urls["relay"], prefix="taskplat_sqs_requests_total")
    calls: dict[str, float] = {}
    for key, value in samples.items():
        op = key.split('op="', 1)[1].split('"', 1)[0] if 'op="' in key else key
        calls[op] = calls.get(op, 0.0) + value
    return calls


def _pending_wakeups(stack: BenchStack, queue: str) -> int:
    return int(stack.one("queue_pending_wakeups", queue=queue)["n"])


def _wakeups_written(stack: BenchStack, queue: str) -> int:
    return int(stack.one("queue_wakeups_written", queue=queue)["n"])


def run(tasks: int, seconds: float, directory: Path) -> int:
    env = dict(BASE_ENV)
    with BenchStack(directory, env, workers=1, say=_say) as stack:
        _api(stack, "PUT", f"/queues/{QUEUE}")
        started = time.monotonic()
        _create(stack, QUEUE, tasks)
        _say(f"{tasks} tasks created on {QUEUE} in {time.monotonic() - started:.1f} s")
        wait_for(
            lambda: _api(stack, "GET", f"/queues/{QUEUE}")["sqs"]["state"] == "missing",
            timeout=60,
            what=f"the relay to hold {QUEUE}",
        )
        # Let the first probes and the deferral of the rows already claimed pass.
        time.sleep(5)
        groups = {
            name: pids
            for name, pids in stack.cpu_groups().items()
            if name in ("relay", "scheduler", "sqs server", "postgres", "dispatcher")
        }
        calls_before, written_before = _relay_requests(stack), _wakeups_written(stack, QUEUE)
        load_before = os.getloadavg()
        before = cpu_snapshot(groups, time.monotonic())
        time.sleep(seconds)
        after = cpu_snapshot(groups, time.monotonic())
        calls_after = _relay_requests(stack)
        calls = {op: n - calls_before.get(op, 0.0) for op, n in calls_after.items()}
        calls = {op: n for op, n in calls.items() if n}
        written = _wakeups_written(stack, QUEUE) - written_before
        wall = after.wall - before.wall
        used = cpu_split(before, after)
        _say(
            f"measured over {wall:.1f} s, load average {load_before[0]:.1f} -> "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        for name in sorted(used):
            _say(
                f"  {name:<12} {used[name]:7.2f} s CPU = {100 * used[name] / wall:5.1f} % of a core"
            )
        _say(f"  relay SQS calls meanwhile: {calls or 'none'}; wake-ups written: {written}")
        held = _api(stack, "GET", f"/queues/{QUEUE}")["sqs"]
        _say(f"  {QUEUE}: {held}; pending wake-ups {_pending_wakeups(stack, QUEUE)}")
        problems = []
        # Held, the queue costs its probes only: one GetQueueUrl at most every probe base (5 s);
        # failing row by row cost a GetQueueUrl or SendMessageBatch per 10 rows and retry.
        probes = calls.get("get_queue_url", 0.0)
        if calls.get("send_message_batch", 0.0) > 0 or probes > seconds / 5 + 2:
            problems.append(f"the relay kept calling SQS for a held queue: {calls}")
        if written > 0:
            problems.append(f"{written} wake-ups were written for the held queue meanwhile")

        default = stack.running().config.queues[0]
        others = _create(stack, default, 20)
        started = time.monotonic()
        wait_for(
            lambda: all(
                _api(stack, "GET", f"/tasks/{task_id}")["status"] == "Completed"
                for task_id in others
            ),
            timeout=120,
            what=f"20 tasks of {default} to complete",
        )
        _say(f"20 tasks of {default} completed in {time.monotonic() - started:.1f} s")

        client = sqs_client(
            stack.running().info.sqs_endpoint_url, stack.running().config.aws_region
        )
        try:
            client.create_queue(QueueName=f"{stack.running().config.queue_prefix}{QUEUE}")
        finally:
            client.close()
        started = time.monotonic()
        wait_for(
            lambda: _pending_wakeups(stack, QUEUE) == 0,
            timeout=180,
            what=f"the wake-ups of {QUEUE} to go out once its SQS queue exists",
        )
        _say(
            f"SQS queue created: every wake-up sent {time.monotonic() - started:.1f} s later; "
            f"{QUEUE}: {_api(stack, 'GET', f'/queues/{QUEUE}')['sqs']['state']}"
        )
    for problem in problems:
        _say(f"FAIL: {problem}")
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taskplat.bench.missing_queue",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--tasks", type=int, default=2000, help="tasks on the queue (2000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window (60)")
    parser.add_argument("--dir", type=Path, default=Path(".run/missing-queue"))
    args = parser.parse_args(argv)
    try:
        return run(args.tasks, args.seconds, args.dir)
    except BenchError as exc:
        print(f"missing-queue: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
