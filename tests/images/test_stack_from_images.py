"""The platform from its images, each container as its ECS task definition says: every container
is non-root on a read-only root filesystem, 200 tasks complete each exactly once, and a
`podman kill` of each service container in turn loses nothing and completes nothing twice.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from taskplat.devstack.images.podman import PODMAN
from taskplat.devstack.images.stack import ImageStack
from taskplat.devstack.waiting import wait_for

COMPLETIONS = """
SELECT t.task_id::text, t.status,
       count(a.attempt) FILTER (WHERE a.outcome = 'Completed')::int AS completions
FROM tasks AS t LEFT JOIN task_attempts AS a ON a.task_id = t.task_id
WHERE t.task_id = ANY(%(ids)s::uuid[])
GROUP BY t.task_id, t.status
"""
SERVICES = (
    "dispatcher",
    "outbox-relay",
    "scheduler",
    "reaper",
    "sink",
    "credential-broker",
    "query-service",
    "worker-1",
)


def _submit(api: httpx.Client, count: int, *, timeout: float = 120.0) -> list[str]:
    """POST `count` echo tasks; a refused connection or a 5xx (the dispatcher being replaced)
    is retried with the same idempotency key, so no retry makes a second task."""
    run = uuid.uuid4().hex

    def post(number: int) -> str:
        payload = {
            "operator": "echo",
            "idempotency_key": f"{run}-{number}",
            "config": {"n": number},
        }

        def attempt() -> str | None:
            try:
                response = api.post("/tasks", json=payload)
            except httpx.TransportError:
                return None
            if response.status_code >= 500:
                return None
            assert response.status_code in (200, 201), response.text
            task_id: str = response.json()["task_id"]
            return task_id

        return wait_for(attempt, timeout=timeout, what="POST /tasks", interval=0.2)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(post, range(count)))


def _rows(stack: ImageStack, ids: Sequence[str]) -> list[dict[str, Any]]:
    with psycopg.connect(stack.info.database_url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(COMPLETIONS, {"ids": list(ids)}).fetchall()


def _assert_each_completed_once(stack: ImageStack, ids: Sequence[str], timeout: float) -> None:
    def finished() -> bool:
        return all(row["status"] == "Completed" for row in _rows(stack, ids))

    try:
        wait_for(finished, timeout=timeout, what=f"{len(ids)} tasks to complete", interval=1.0)
    except TimeoutError:
        statuses: dict[str, int] = {}
        for row in _rows(stack, ids):
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        raise AssertionError(f"not all tasks completed: {statuses}") from None
    rows = _rows(stack, ids)
    assert len(rows) == len(set(ids)) == len(ids), "a task is missing"
    twice = [row["task_id"] for row in rows if row["completions"] != 1]
    assert not twice, f"tasks completed other than once: {twice}"


def _inspect(stack: ImageStack, name: str, template: str) -> str:
    container = stack.containers[name].plan.container_name
    out = subprocess.run(
        [*PODMAN, "inspect", "--format", template, container], capture_output=True, text=True
    )
    return out.stdout.strip()


def test_every_container_is_non_root_on_a_read_only_root(image_stack: ImageStack) -> None:
    for name, running in image_stack.containers.items():
        container = running.plan.container_name
        assert _inspect(image_stack, name, "{{.HostConfig.ReadonlyRootfs}}") == "true", name
        uid = subprocess.run(
            [*PODMAN, "exec", container, "id", "-u"], capture_output=True, text=True
        ).stdout.strip()
        assert uid and uid != "0", f"{name} runs as uid {uid!r}"
        probe = subprocess.run(
            [*PODMAN, "exec", container, "touch", "/probe"], capture_output=True, text=True
        )
        assert probe.returncode != 0 and "Read-only" in probe.stderr, (name, probe.stderr)
        for _, path in running.definition.mounts:  # the declared writable paths are writable
            wrote = subprocess.run(
                [*PODMAN, "exec", container, "sh", "-c", f"mktemp -p {path} && true"],
                capture_output=True,
                text=True,
            )
            assert wrote.returncode == 0, (name, path, wrote.stderr)


def test_two_hundred_tasks_complete_each_exactly_once(
    image_stack: ImageStack, api: httpx.Client
) -> None:
    ids = _submit(api, 200)
    _assert_each_completed_once(image_stack, ids, timeout=300)


@pytest.mark.parametrize("service", SERVICES)
def test_podman_kill_loses_nothing_and_completes_nothing_twice(
    service: str, image_stack: ImageStack, api: httpx.Client
) -> None:
    running = image_stack.containers[service]
    restarts = running.restarts
    ids = _submit(api, 20)
    killed = subprocess.run(
        [*PODMAN, "kill", running.plan.container_name], capture_output=True, text=True
    )
    assert killed.returncode == 0, killed.stderr
    ids += _submit(api, 20)
    wait_for(
        lambda: running.restarts > restarts,
        timeout=30,
        what=f"{service} to be started again",
        interval=0.5,
    )
    image_stack.wait_all_healthy([service])
    # A killed worker's claims come back when their leases expire (10 s here) and the reaper
    # and scheduler queue the retries.
    _assert_each_completed_once(image_stack, ids, timeout=240)
