"""Running attempts for tools and tests that mint capability tokens themselves (the bench's W6,
the query service's tests): the database answers a token's reads only while its attempt runs
and only for the versions its task pins (`taskplat_query_inputs`, migration 0029).

Invariant: the task is made as the dispatcher makes one (`taskplat_create_tasks`, then
`taskplat_claim`), never by rows written here; it is Running at attempt 1 when this returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from taskplat.devstack.errors import DevstackError

QUEUE = "capability-readers"
OPERATOR = "capability-reader"


def running_attempt(database_url: str, pins: Sequence[Mapping[str, Any]]) -> UUID:
    """A task whose inputs are `pins` (`{dataset_uuid, dataset_version, ...}`), Running at
    attempt 1 for an hour; its id."""
    task_id = uuid.uuid4()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "SELECT 1 FROM taskplat_create_tasks(ARRAY[ROW(%s, %s, %s, NULL, '{}', %s, 1, NULL, "
            "NULL, 1, 1, NULL, NULL, NULL, NULL, NULL, NULL)::taskplat_new_task])",
            (task_id, QUEUE, OPERATOR, Jsonb([dict(pin) for pin in pins])),
        )
        claimed = conn.execute(
            "SELECT task_id FROM taskplat_claim(ARRAY[%s]::uuid[], %s, 3600, 3600)",
            (task_id, OPERATOR),
        ).fetchall()
    if not claimed:
        raise DevstackError(f"task {task_id} was made but not claimed (a limit on {QUEUE}?)")
    return task_id


def end_attempts(database_url: str, task_ids: Sequence[UUID]) -> None:
    """Cancel `task_ids`: their attempts end (`taskplat_cancel_tasks`)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT taskplat_cancel_tasks(%s::uuid[], 'Requested')", (list(task_ids),))
