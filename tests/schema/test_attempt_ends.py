"""Every end of a Running attempt is the one end (taskplat_end_running, migration 0022).

The dispatcher's completion (taskplat_end_attempts) and the reaper's timeouts
(taskplat_reap_timeouts) both end attempts. Twin tasks, claimed alike, are ended one by each
path, the completion reporting what the timeout would have said (`Drained` for a lost lease,
`Failed` for a deadline overrun, with the timeout's error): their rows, attempt records and
dead-letter records come out the same in every column but the outcome's name, for a retry, for an
exhausted budget and for exhausted processing attempts. A path that re-states the columns an end
sets instead of calling the function, and drifts, fails here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from taskplat.common.db.queries import load_queries, parse_queries

_SQL_PATH = Path(__file__).with_name("attempt_ends_rows.sql")
ROWS = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))
CLAIM = load_queries("taskplat.dispatcher.repository", "tasks.sql")["claim_task"]
COMPLETE = load_queries("taskplat.dispatcher.repository", "tasks.sql")["complete_running"]
REAP = load_queries("taskplat.reaper", "reaper.sql")["reap_timeouts"]
CLAIMED_AT = datetime(2030, 1, 1, tzinfo=UTC)
GRACE_SECONDS = 5.0
JITTER = 0.5
# How each timeout is reached: the claim's lease, when the reaper runs (the task's timeout is
# 30 s), what the reaper calls it, and what a holder reports for the same end.
TIMEOUTS = {
    "lease": (20.0, timedelta(seconds=25), "LeaseExpired", "Drained", "lease expired"),
    "deadline": (3600.0, timedelta(seconds=60), "DeadlineExceeded", "Failed", "deadline exceeded"),
}
# The columns that name the outcome or the task itself, not how it ended.
OWN = {"task_id", "lease_token", "attempt_outcome", "outcome"}


def _claim(conn: psycopg.Connection[dict[str, Any]], task_id: UUID, lease: float) -> UUID:
    params = {
        "task_id": task_id,
        "worker_id": "w-1",
        "lease_seconds": lease,
        "default_timeout_seconds": 60,
        "now": CLAIMED_AT,
        "lease_token": uuid4(),
        "capability_keys": True,
        "untrusted_operators": [],
    }
    row = conn.execute(CLAIM, params).fetchone()
    assert row is not None
    token: UUID = row["lease_token"]
    return token


def _state(conn: psycopg.Connection[dict[str, Any]], task_id: UUID) -> dict[str, Any]:
    task = conn.execute(ROWS["task"], {"task_id": task_id}).fetchone()
    record = conn.execute(ROWS["attempt_record"], {"task_id": task_id}).fetchall()
    letters = conn.execute(ROWS["dead_letters"], {"task_id": task_id}).fetchall()
    assert task is not None and len(record) == 1
    return {
        "task": {k: v for k, v in task.items() if k not in OWN},
        "attempt": {k: v for k, v in record[0].items() if k not in OWN},
        "dead_letters": letters,
        "outcomes": (task["attempt_outcome"], record[0]["outcome"]),
    }


@pytest.mark.parametrize(
    ("timeout", "max_attempts", "max_processing_attempts", "status", "dead_reason"),
    [
        ("lease", 3, 10, "Failed", None),
        ("deadline", 3, 10, "Failed", None),
        ("deadline", 1, 10, "Dead", "AttemptsExhausted"),
        ("lease", 3, 1, "Dead", "ProcessingAttemptsExceeded"),
    ],
)
def test_the_completion_and_the_timeouts_end_an_attempt_alike(
    db_url: str,
    timeout: str,
    max_attempts: int,
    max_processing_attempts: int,
    status: str,
    dead_reason: str | None,
) -> None:
    lease, after, timed_out, reported, error = TIMEOUTS[timeout]
    ended_at = CLAIMED_AT + after
    completed, reaped = uuid4(), uuid4()
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        for task_id in (completed, reaped):
            conn.execute(
                ROWS["insert_task"],
                {"task_id": task_id, "max_attempts": max_attempts,
                 "max_processing_attempts": max_processing_attempts, "now": CLAIMED_AT},
            )  # fmt: skip
        token = _claim(conn, completed, lease)
        _claim(conn, reaped, lease)
        done = conn.execute(
            COMPLETE,
            {"task_id": completed, "attempt": 1, "lease_token": token, "ended": reported,
             "retryable": True, "result": None, "error_message": error,
             "retry_after_seconds": None, "jitter": JITTER, "completion_digest": None,
             "events": Jsonb([]), "outputs": Jsonb([]), "now": ended_at, "trace_context": None},
        ).fetchall()  # fmt: skip
        assert [row["task_id"] for row in done] == [completed]
        moved = conn.execute(
            REAP,
            {"now": ended_at, "grace_seconds": GRACE_SECONDS, "limit": 10, "jitters": [JITTER]},
        ).fetchall()
        assert [(row["task_id"], row["ended"]) for row in moved] == [(reaped, timed_out)]
        by_completion = _state(conn, completed)
        by_timeout = _state(conn, reaped)
    assert by_completion.pop("outcomes") == (reported, reported)
    assert by_timeout.pop("outcomes") == (timed_out, timed_out)
    assert by_completion == by_timeout
    task = by_timeout["task"]
    assert (task["status"], task["dead_reason"], task["last_error"]) == (
        status,
        dead_reason,
        error,
    )
    assert task["lease_expires_at"] is None and task["updated_at"] == ended_at
    assert (task["finished_at"] is None) == (status == "Failed")
    assert (task["next_retry_at"] is None) == (status == "Dead")
    assert len(by_timeout["dead_letters"]) == (1 if status == "Dead" else 0)
    assert by_timeout["attempt"]["finished_at"] == ended_at
    assert by_timeout["attempt"]["error"] == error


@pytest.mark.parametrize("function", ["taskplat_end_attempts", "taskplat_reap_timeouts"])
def test_each_path_calls_the_end_and_restates_none_of_it(db_url: str, function: str) -> None:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        row = conn.execute(ROWS["function_source"], {"name": function}).fetchone()
    assert row is not None
    source = " ".join(row["source"].split())
    assert "taskplat_end_running(" in source
    for restated in ("UPDATE tasks", "UPDATE task_attempts", "attempt_outcome", "finished_at ="):
        assert restated not in source, restated
