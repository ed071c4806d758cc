"""No untrusted task without its capability token (docs/ARCHITECTURE.md "Untrusted operators").

Invariants: a task is untrusted when its job says `trust: untrusted` or its operator is one of the
`untrusted_operators` setting (as `TokenIssuer.trust` decides at claim time). While the dispatcher
has no capability keys, applying a DAG with an untrusted job, creating a task of an untrusted job
or operator, and starting a run of an untrusted job answer 422 naming the missing setting: such a
task could only ever be claimed without its token. Untrusted work created while the keys were
there is not claimable by a dispatcher without them (claims.py, migration 0024).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from taskplat.common.contracts import CreateTaskRequest
from taskplat.common.errors import ValidationFailed
from taskplat.dispatcher.repository import dags as repo
from taskplat.dispatcher.settings import DispatcherSettings

MISSING_SETTING = "TASKPLAT_CAPABILITY_TOKEN_KEYS"
# The detail of a claim's NotClaimed `MissingCapabilityKeys` (claims.py).
NOT_CLAIMED_DETAIL = (
    f"{MISSING_SETTING} is not set: the task runs untrusted and this dispatcher has no "
    "capability keys to sign its capability token, so it is not handed out (it stays Queued)"
)

Row = dict[str, Any]


def capability_keys_configured(settings: DispatcherSettings) -> bool:
    # The settings' validator checked the keys (and their active kid) once at startup.
    return bool(settings.capability_token_keys)


def untrusted(settings: DispatcherSettings, operator: str, job_trust: str | None) -> bool:
    return job_trust == "untrusted" or operator in settings.untrusted_operators


def refuse(names: Iterable[str], loc: list[str | int]) -> ValidationFailed:
    """The 422 for untrusted work while no capability keys are configured."""
    listed = ", ".join(sorted(set(names)))
    message = (
        f"{listed} would run untrusted, and an untrusted task never runs without its "
        f"capability token: the dispatcher has no capability keys (set {MISSING_SETTING} and "
        "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID)"
    )
    return ValidationFailed(
        message,
        detail=[{"loc": loc, "msg": f"{MISSING_SETTING} is not set", "type": "missing_setting",
                 "setting": MISSING_SETTING}],
    )  # fmt: skip


async def check_new_tasks(
    conn: AsyncConnection[DictRow],
    settings: DispatcherSettings,
    requests: Sequence[CreateTaskRequest],
    loc: list[str | int],
) -> None:
    """Refuse (422) the creation of untrusted tasks while no capability keys are configured."""
    if capability_keys_configured(settings):
        return
    trust: dict[tuple[str, str], Row | None] = {}
    names: list[str] = []
    for request in requests:
        job_trust = None
        if request.job is not None:
            key = (request.job.dag_name, request.job.name)
            if key not in trust:
                trust[key] = await repo.job_trust(conn, *key)
            job = trust[key]
            job_trust = None if job is None else str(job["trust"])
        if untrusted(settings, request.operator, job_trust):
            names.append(
                f"job {request.job.dag_name}/{request.job.name}"
                if job_trust == "untrusted" and request.job is not None
                else f"operator {request.operator!r}"
            )
    if names:
        raise refuse(names, loc)


async def check_job_run(
    conn: AsyncConnection[DictRow],
    settings: DispatcherSettings,
    dag_name: str,
    job_name: str,
    loc: list[str | int],
) -> None:
    """Refuse (422) a run of an untrusted job while no capability keys are configured."""
    if capability_keys_configured(settings):
        return
    job = await repo.job_trust(conn, dag_name, job_name)
    if job is not None and untrusted(settings, str(job["operator"]), str(job["trust"])):
        raise refuse([f"job {dag_name}/{job_name}"], loc)
