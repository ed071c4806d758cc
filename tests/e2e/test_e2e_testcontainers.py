"""End to end against Postgres and LocalStack run by testcontainers (Docker), when a Docker engine
answers; skipped cleanly, with the reason, when none does.

Invariant: the same harness and stack as the other modules; only the servers come from containers.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from e2e_stack import e2e_stack

pytestmark = pytest.mark.e2e


def test_tasks_complete_on_testcontainers_servers(
    testcontainers_postgres_url: str, testcontainers_localstack_url: str, tmp_path: Path
) -> None:
    with e2e_stack(
        "containers",
        tmp_path / "stack",
        database_server_url=testcontainers_postgres_url,
        sqs_endpoint_url=testcontainers_localstack_url,
        workers=1,
    ) as stack:
        tag = uuid.uuid4().hex
        task_ids = stack.create_many(
            [{"operator": "echo", "config": {"n": n, "tag": tag}} for n in range(20)]
        )

        counts = stack.wait_all_terminal(task_ids, timeout=60)

        assert counts == {"Completed": 20}
        results = stack.rows("results", ids=task_ids)
        assert all(row["result"] == row["config"] for row in results)
