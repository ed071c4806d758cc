"""Example untrusted operator `top-words` (Python): the `config["limit"]` (default 3) most frequent
words of its pinned input dataset (`word text, n bigint`, as `word-count` publishes it), read
through the query service.

It runs in a job marked `trust: untrusted`: where the wrapper can switch users it runs as the
image's second user (`taskplat-operator`, uid 10002), it has no database URL and no AWS
credentials, and its capability token (`TASKPLAT_CAPABILITY_TOKEN`, given by the wrapper) names
exactly its pinned inputs; `query()` posts it with the SQL to the query service, which allows a
SELECT over those inputs only. Each input is a view named `dataset_<uuid hex>` (docs/security.md).

Invariants: reads only, no effects; the payload says which user ran it (`uid`) and what it read
(`top`: rows of `word`, `n`); a task with no pinned input fails permanently.
"""

from __future__ import annotations

import os
import uuid

from taskplat.lambda_runtime import PermanentFailure, Task, query, serve

SQL = "SELECT word, n FROM {view} ORDER BY n DESC, word LIMIT ?"


def handle(task: Task) -> dict[str, object]:
    if not task.inputs or "dataset_uuid" not in task.inputs[0]:
        raise PermanentFailure("top-words reads one pinned input dataset; the task has none")
    view = "dataset_" + uuid.UUID(str(task.inputs[0]["dataset_uuid"])).hex
    limit = int(task.config.get("limit", 3))
    top = query(SQL.format(view=view), [limit]).records()
    return {"uid": os.getuid(), "top": top}


if __name__ == "__main__":
    raise SystemExit(serve(handle))
