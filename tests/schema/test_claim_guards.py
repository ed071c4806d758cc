"""Every claim statement of every service is the one claim (taskplat_claim / taskplat_claim_next,
migration 0020) and keeps its guards.

Each caller (the dispatcher's single, batch and claim-next statements, the relay's claim for a
Lambda function) runs on every kind of task: Queued, expired, on a paused queue, of a
`runtime: lambda` job, in each other status, missing. It claims exactly the claimable ones
(Queued, unexpired, queue not paused; claim-next also skips a `runtime: lambda` job's task),
records one attempt for each, and answers the same columns with the same values (only the lease,
its expiry and the worker differ for a Lambda function). A caller without capability keys claims
no untrusted task (migration 0024) and writes nothing. A caller that re-states the transition
instead of calling the function, or a guard lost from the function, fails here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, LiteralString
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from taskplat.common.db.queries import load_queries, parse_queries

_SQL_PATH = Path(__file__).with_name("claim_guards_rows.sql")
ROWS = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))
NOW = datetime(2030, 1, 1, tzinfo=UTC)
WORKER = "w-1"


@dataclass(frozen=True)
class Caller:
    package: str
    filename: str
    name: str
    function: str  # the claim function it must call
    claims_lambda_jobs: bool

    @property
    def statement(self) -> LiteralString:
        return load_queries(self.package, self.filename)[self.name]


CALLERS = [
    Caller("taskplat.dispatcher.repository", "tasks.sql", "claim_task", "taskplat_claim", True),
    Caller("taskplat.dispatcher.repository", "batch.sql", "claim_tasks", "taskplat_claim", True),
    Caller(
        "taskplat.dispatcher.repository", "batch.sql", "claim_next", "taskplat_claim_next", False
    ),
    Caller(
        "taskplat.outbox_relay.lambda_invoker",
        "invoke.sql",
        "claim_for_function",
        "taskplat_claim",
        True,
    ),
]
LAMBDA = "claim_for_function"

# (status, expired, paused queue, of a runtime: lambda job, claimable by every caller)
CASES = [
    ("Queued", False, False, False, True),
    ("Queued", True, False, False, False),
    ("Queued", False, True, False, False),
    ("Queued", False, False, True, True),  # but not by claim-next
    ("Scheduled", False, False, False, False),
    ("Running", False, False, False, False),
    ("Failed", False, False, False, False),
    ("Completed", False, False, False, False),
    ("Dead", False, False, False, False),
    ("Canceled", False, False, False, False),
    (None, False, False, False, False),  # no such task
]


def _params(caller: Caller, task_id: UUID, queue: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "task_ids": [task_id],
        "queue": queue,
        "max": 10,
        "lease_token": uuid4(),
        "worker_id": WORKER,
        "function_prefix": "taskplat-",
        "lease_seconds": 20,
        "default_timeout_seconds": 60,
        "grace_seconds": 5,
        "now": NOW,
        "capability_keys": True,
        "untrusted_operators": [],
    }


def _claim(url: str, caller: Caller, task_id: UUID, queue: str) -> tuple[list[Any], int]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        try:
            rows = conn.execute(caller.statement, _params(caller, task_id, queue)).fetchall()
            attempts = conn.execute(ROWS["attempts"], {"task_id": task_id}).fetchone()
            assert attempts is not None
            return rows, attempts["attempts"]
        finally:
            conn.rollback()


@pytest.mark.parametrize("caller", CALLERS, ids=[caller.name for caller in CALLERS])
def test_the_caller_calls_the_claim_function_and_restates_nothing(caller: Caller) -> None:
    statement = caller.statement
    assert f"{caller.function}(" in statement
    assert "UPDATE" not in statement.upper() and "task_attempts" not in statement


@pytest.mark.parametrize(("status", "expired", "paused", "lambda_job", "claimable"), CASES)
def test_every_caller_claims_exactly_the_claimable_tasks(
    db_url: str,
    status: str | None,
    expired: bool,
    paused: bool,
    lambda_job: bool,
    claimable: bool,
) -> None:
    task_id = uuid4()
    queue = f"q-{task_id.hex[:12]}"  # a queue of its own: claim-next sees this task only
    job = None
    with psycopg.connect(db_url, autocommit=True) as conn:
        if paused:
            conn.execute(ROWS["pause_queue"], {"queue": queue})
        if lambda_job:
            dag = f"dag-{task_id.hex[:12]}"
            conn.execute(ROWS["insert_lambda_job"], {"dag": dag, "queue": queue})
            job = Jsonb({"dag_name": dag, "name": "fn"})
        if status is not None:
            expires_at = NOW - timedelta(seconds=1) if expired else None
            conn.execute(
                ROWS["insert_task"],
                {"task_id": task_id, "status": status, "queue": queue, "job": job,
                 "expires_at": expires_at, "now": NOW},
            )  # fmt: skip
    answers: dict[str, dict[str, Any]] = {}
    for caller in CALLERS:
        expected = claimable and (caller.claims_lambda_jobs or not lambda_job)
        rows, attempts = _claim(db_url, caller, task_id, queue)
        assert [row["task_id"] for row in rows] == ([task_id] if expected else []), caller.name
        assert attempts == (1 if expected else 0), caller.name
        if rows:
            answers[caller.name] = rows[0]
    if not answers:
        return
    dispatcher = answers["claim_task"]
    assert dispatcher["worker_id"] == WORKER
    assert dispatcher["deadline_at"] == NOW + timedelta(seconds=30)  # the task's timeout
    assert dispatcher["lease_expires_at"] == NOW + timedelta(seconds=20)
    lease_fields = {"lease_token", "lease_expires_at", "worker_id"}
    for name, row in answers.items():
        assert list(row) == list(dispatcher), name
        if name == LAMBDA:
            assert row["worker_id"] == "lambda:taskplat-probe"
            assert row["lease_expires_at"] == NOW + timedelta(seconds=35)  # timeout + grace
            row = {k: v for k, v in row.items() if k not in lease_fields}
            expect = {k: v for k, v in dispatcher.items() if k not in lease_fields}
        else:
            row = {k: v for k, v in row.items() if k != "lease_token"}
            expect = {k: v for k, v in dispatcher.items() if k != "lease_token"}
        assert row == expect, name


def test_a_single_claim_keeps_the_callers_lease_token_and_a_batch_gets_one_per_task(
    db_url: str,
) -> None:
    first, second = sorted([uuid4(), uuid4()])
    with psycopg.connect(db_url, autocommit=True) as conn:
        for task_id in (first, second):
            conn.execute(
                ROWS["insert_task"],
                {"task_id": task_id, "status": "Queued", "queue": "default", "job": None,
                 "expires_at": None, "now": NOW},
            )  # fmt: skip
    single = CALLERS[0]
    params = _params(single, first, "default")
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        try:
            row = conn.execute(single.statement, params).fetchone()
            assert row is not None and row["lease_token"] == params["lease_token"]
        finally:
            conn.rollback()
    batch = CALLERS[1]
    params = {**_params(batch, first, "default"), "task_ids": [second, first, first]}
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        try:
            rows = conn.execute(batch.statement, params).fetchall()
        finally:
            conn.rollback()
    assert sorted(row["task_id"] for row in rows) == [first, second]  # each once
    assert len({row["lease_token"] for row in rows}) == 2


# (the runtime of the job that says untrusted, or None: the operator is listed as untrusted)
UNTRUSTED = ["ecs", "lambda", None]


@pytest.mark.parametrize("job_runtime", UNTRUSTED)
def test_a_caller_without_capability_keys_claims_no_untrusted_task(
    db_url: str, job_runtime: str | None
) -> None:
    job_untrusted = job_runtime is not None
    task_id = uuid4()
    queue = f"q-{task_id.hex[:12]}"
    dag = f"dag-{task_id.hex[:12]}"
    job = None
    with psycopg.connect(db_url, autocommit=True) as conn:
        if job_untrusted:
            conn.execute(
                ROWS["insert_untrusted_job"], {"dag": dag, "queue": queue, "runtime": job_runtime}
            )
            job = Jsonb({"dag_name": dag, "name": "udf"})
        conn.execute(
            ROWS["insert_task"],
            {"task_id": task_id, "status": "Queued", "queue": queue, "job": job,
             "expires_at": None, "now": NOW},
        )  # fmt: skip
    for caller in CALLERS:
        if caller.name == "claim_next" and job_runtime == "lambda":
            continue  # claim-next never takes a Lambda job's task
        if caller.name == LAMBDA and not job_untrusted:
            continue  # a Lambda task always has a job: its trust is the job's (no operator list)
        params = _params(caller, task_id, queue)
        if not job_untrusted:
            params["untrusted_operators"] = ["probe"]
        for keys, expected in ((False, []), (True, [task_id])):
            with psycopg.connect(db_url, row_factory=dict_row) as conn:
                try:
                    before = conn.execute(ROWS["task_version"], {"task_id": task_id}).fetchone()
                    rows = conn.execute(
                        caller.statement, {**params, "capability_keys": keys}
                    ).fetchall()
                    after = conn.execute(ROWS["task_version"], {"task_id": task_id}).fetchone()
                    attempts = conn.execute(ROWS["attempts"], {"task_id": task_id}).fetchone()
                finally:
                    conn.rollback()
            assert [row["task_id"] for row in rows] == expected, (caller.name, keys)
            assert attempts is not None
            assert attempts["attempts"] == len(expected), (caller.name, keys)
            if not expected:
                assert after == before, caller.name  # nothing written, not even a lock
            else:
                assert rows[0]["trust"] == ("untrusted" if job_untrusted else "trusted")
