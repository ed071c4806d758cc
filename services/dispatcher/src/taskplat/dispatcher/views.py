"""Conversions from database rows to contract models.

Invariant: a view is built only from a row read after the transaction that changed it committed, or
returned by the committed statement that changed it (a create's), so what a client sees is what the
database holds.
"""

from __future__ import annotations

from typing import Any

from taskplat.common.claim_answer import claim_task
from taskplat.common.contracts import ClaimTask, TaskView

_TASK_VIEW_FIELDS = tuple(TaskView.model_fields)


def task_view(row: dict[str, Any]) -> TaskView:
    return TaskView.model_validate({field: row[field] for field in _TASK_VIEW_FIELDS})


def claim_task_payload(row: dict[str, Any], *, trust: str | None = None) -> ClaimTask:
    return claim_task(row, trust=trust)
