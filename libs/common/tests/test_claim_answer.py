"""The claim answer the dispatcher and the relay's Lambda invoker both build from a claimed row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

from pydantic import SecretStr

from taskplat.common.claim_answer import attempt_token, claimed_response, token_expiry
from taskplat.common.tokens.attempt import attempt_key_ring, verify_attempt_token
from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem

STARTED = datetime(2030, 1, 1, tzinfo=UTC)
RING = attempt_key_ring(
    TokenKeySettings(keys={"k1": SecretStr(private_key_pem(b"\x61" * 32))}, active_kid="k1")
)


def _row(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "task_id": uuid4(),
        "attempt": 2,
        "job": None,
        "operator": "echo",
        "queue": "default",
        "config": {"n": 1},
        "inputs": [],
        "timeout_seconds": 60,
        "deadline_at": STARTED + timedelta(seconds=60),
        "lease_token": uuid4(),
        "lease_expires_at": STARTED + timedelta(seconds=30),
        "worker_id": "w-1",
        "started_at": STARTED,
        "outputs": [],
        "trust": "trusted",
        "steps": {},
        "trace_context": None,
    }
    row.update(fields)
    return row


def test_tokens_expire_after_the_later_of_the_deadline_and_the_lease() -> None:
    extra = timedelta(seconds=5)
    assert token_expiry(_row(), extra) == STARTED + timedelta(seconds=65)
    late_lease = _row(lease_expires_at=STARTED + timedelta(seconds=90))
    assert token_expiry(late_lease, extra) == STARTED + timedelta(seconds=95)
    no_deadline = _row(deadline_at=None)
    assert token_expiry(no_deadline, extra) == STARTED + timedelta(seconds=35)


def test_the_attempt_token_is_scoped_to_the_claimed_attempt() -> None:
    row = _row()
    scope = verify_attempt_token(
        RING, attempt_token(RING, row, timedelta(seconds=5)), now=STARTED + timedelta(seconds=1)
    )
    assert (scope.task_id, scope.attempt) == (row["task_id"], 2)
    assert scope.expires_at == int((STARTED + timedelta(seconds=65)).timestamp())


def test_the_answer_carries_the_row_and_the_tokens() -> None:
    row = _row(trace_context={"traceparent": "00-1-2-01"})
    answer = claimed_response(row, attempt_token="t", capability_token="c", trust="untrusted")
    assert (answer.attempt, answer.lease_token, answer.lease_expires_at) == (
        2, row["lease_token"], row["lease_expires_at"]
    )  # fmt: skip
    assert (answer.attempt_token, answer.capability_token) == ("t", "c")
    assert answer.trace_context == {"traceparent": "00-1-2-01"}
    assert answer.task.task_id == row["task_id"] and answer.task.trust == "untrusted"
    assert claimed_response(row, attempt_token="t").task.trust == "trusted"
