"""End to end, issue 4: services killed with SIGKILL at random moments of a run, restarted by the
stack's supervisor (as ECS would), lose no task and complete none twice.

The kill moments are drawn at random (the seed is printed) as progress thresholds: when the number
of completed tasks passes the next one, the next victim is killed. So kills land during submission,
in full flow and near the end, and waiting stays condition-based.
"""

from __future__ import annotations

import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2e_stack import E2EStack, e2e_stack, marker_lines, new_marker

from taskplat.devstack.waiting import wait_for

pytestmark = pytest.mark.e2e

LOOPS = ("relay", "scheduler", "reaper")


@pytest.fixture(scope="module")
def stack(
    database_url: str, sqs_endpoint_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2EStack]:
    with e2e_stack(
        "chaos",
        tmp_path_factory.mktemp("stack-chaos"),
        database_server_url=database_url,
        sqs_endpoint_url=sqs_endpoint_url,
        workers=2,
        env={
            # Leases do not expire under load here: this module is about killed services.
            "TASKPLAT_DISPATCHER_LEASE_TTL_SECONDS": "6",
            # A backlog of 2,000 tasks is not a lost wake-up: no republish storm.
            "TASKPLAT_SCHEDULER_REQUEUE_AFTER_SECONDS": "30",
        },
    ) as running:
        yield running


def _run_with_kills(
    stack: E2EStack,
    *,
    count: int,
    marker: Path,
    victims: list[str],
    rng: random.Random,
    timeout: float,
) -> tuple[list[str], list[tuple[str, int]]]:
    """Submit `count` record tasks (in a thread) and kill `victims` in order at random progress
    points; return the task ids and the kills done as (service, completed-when-killed).

    A victim killed twice in a row is killed again only once its restart runs: a SIGKILL takes
    effect asynchronously, so the dying process may still look alive for a moment, and a second
    SIGKILL to it would be no second crash."""
    tag = uuid.uuid4().hex
    bodies = [
        {"operator": "record", "config": {"tag": tag, "marker": str(marker), "n": n}}
        for n in range(count)
    ]
    submitter = ThreadPoolExecutor(1)
    submitted = submitter.submit(stack.create_many, bodies)
    thresholds = sorted(rng.randrange(0, count * 9 // 10) for _ in victims)
    kills: list[tuple[str, int]] = []
    killed_pids: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    try:
        for victim, threshold in zip(victims, thresholds, strict=True):

            def reached(threshold: int = threshold) -> int | None:
                completed: int = stack.rows("tag_progress", tag=tag)[0]["completed"]
                return completed if completed >= threshold else None

            completed = wait_for(
                reached,
                timeout=max(deadline - time.monotonic(), 1),
                what=f"{threshold} completed tasks",
                interval=0.05,
            )
            stack.stack.wait_running(victim, timeout=30, not_pid=killed_pids.get(victim))
            killed_pids[victim] = stack.stack.kill(victim, signal.SIGKILL)
            kills.append((victim, completed or 0))
    finally:
        submitter.shutdown(wait=True)
    task_ids = submitted.result()
    assert len(task_ids) == count
    counts = stack.wait_all_terminal(task_ids, timeout=max(deadline - time.monotonic(), 1))
    assert counts == {"Completed": count}, counts
    for victim, pid in killed_pids.items():  # the last kill of each is recorded once it restarts
        stack.stack.wait_running(victim, timeout=30, not_pid=pid)
    return task_ids, kills


def test_killing_the_loops_loses_no_task_and_completes_none_twice(
    stack: E2EStack, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    print(f"chaos seed {seed}")
    rng = random.Random(seed)
    victims = [name for name in LOOPS for _ in range(4)]
    rng.shuffle(victims)
    marker = new_marker(tmp_path)

    task_ids, kills = _run_with_kills(
        stack, count=2000, marker=marker, victims=victims, rng=rng, timeout=240
    )

    print(f"kills (service, completed at the time): {kills}")
    rows = stack.rows("completion_counts", ids=task_ids)
    assert len(rows) == 2000
    assert [r for r in rows if r["completions"] != 1] == []
    assert [r for r in rows if r["attempts"] != 1] == []
    lines = marker_lines(marker)
    assert len(lines) == 2000
    assert Counter(line.split()[0] for line in lines) == Counter(task_ids)
    for name in LOOPS:
        assert stack.stack.exits(name).count(-signal.SIGKILL) == 4, (name, stack.stack.exits(name))


def test_killing_any_service_loses_no_task_and_completes_none_twice(
    stack: E2EStack, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    print(f"chaos seed {seed}")
    rng = random.Random(seed)
    services = [*LOOPS, "dispatcher", "worker-1", "worker-2"]
    victims = rng.sample(services, len(services))
    marker = new_marker(tmp_path)

    task_ids, kills = _run_with_kills(
        stack, count=500, marker=marker, victims=victims, rng=rng, timeout=180
    )

    print(f"kills (service, completed at the time): {kills}")
    rows = stack.rows("completion_counts", ids=task_ids)
    assert [r for r in rows if r["completions"] != 1] == []
    # A killed wrapper's tasks run again after their lease expired; every task still ran to the
    # end at least once, and its effect is recorded by the operator.
    assert set(line.split()[0] for line in marker_lines(marker)) == set(task_ids)
