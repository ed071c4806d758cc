"""The relay's claim on a function's behalf (`claim_for_function`, taskplat.outbox_relay) keeps
the dispatcher's claim guards (`claim_task`): the two services share no code, so this test holds
the two statements to the same answer, the same attempt record and the same returned columns on
every kind of task (Queued, expired, on a paused queue, in each other status, missing). A guard
added to one and not the other fails here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import dict_row

from taskplat.common.db.queries import load_queries, parse_queries

_SQL_PATH = Path(__file__).with_name("claim_guards_rows.sql")
ROWS = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))
DISPATCHER = load_queries("taskplat.dispatcher.repository", "tasks.sql")["claim_task"]
RELAY = load_queries("taskplat.outbox_relay", "invoke.sql")["claim_for_function"]
NOW = datetime(2030, 1, 1, tzinfo=UTC)

# (status, expired, paused queue, claimable)
CASES = [
    ("Queued", False, False, True),
    ("Queued", True, False, False),
    ("Queued", False, True, False),
    ("Scheduled", False, False, False),
    ("Running", False, False, False),
    ("Failed", False, False, False),
    ("Completed", False, False, False),
    ("Dead", False, False, False),
    ("Canceled", False, False, False),
    (None, False, False, False),  # no such task
]


def _claim(url: str, statement: Any, task_id: UUID) -> tuple[dict[str, Any] | None, int]:
    params = {
        "task_id": task_id,
        "lease_token": uuid4(),
        "worker_id": "w-1",
        "function_prefix": "taskplat-",
        "lease_seconds": 30,
        "default_timeout_seconds": 60,
        "grace_seconds": 5,
        "now": NOW,
    }
    with psycopg.connect(url, row_factory=dict_row) as conn:
        try:
            row = conn.execute(statement, params).fetchone()
            attempts = conn.execute(ROWS["attempts"], {"task_id": task_id}).fetchone()
            assert attempts is not None
            return row, attempts["attempts"]
        finally:
            conn.rollback()


@pytest.mark.parametrize(("status", "expired", "paused", "claimable"), CASES)
def test_the_relay_claims_exactly_what_the_dispatcher_claims(
    db_url: str, status: str | None, expired: bool, paused: bool, claimable: bool
) -> None:
    task_id = uuid4()
    queue = "paused-q" if paused else "default"
    with psycopg.connect(db_url, autocommit=True) as conn:
        if paused:
            conn.execute(ROWS["pause_queue"], {"queue": queue})
        if status is not None:
            expires_at = NOW - timedelta(seconds=1) if expired else None
            conn.execute(
                ROWS["insert_task"],
                {"task_id": task_id, "status": status, "queue": queue,
                 "expires_at": expires_at, "now": NOW},
            )  # fmt: skip
    dispatcher_row, dispatcher_attempts = _claim(db_url, DISPATCHER, task_id)
    relay_row, relay_attempts = _claim(db_url, RELAY, task_id)
    assert (dispatcher_row is not None) is claimable
    assert (relay_row is not None) is claimable
    assert relay_attempts == dispatcher_attempts == (1 if claimable else 0)
    if dispatcher_row is not None and relay_row is not None:
        assert list(relay_row) == list(dispatcher_row)
        differ = {"lease_token", "lease_expires_at", "worker_id"}
        assert {k: v for k, v in relay_row.items() if k not in differ} == {
            k: v for k, v in dispatcher_row.items() if k not in differ
        }
        assert relay_row["worker_id"] == "lambda:taskplat-probe"
        assert (
            relay_row["deadline_at"] == dispatcher_row["deadline_at"] == NOW + timedelta(seconds=30)
        )
        assert relay_row["lease_expires_at"] == NOW + timedelta(seconds=35)
