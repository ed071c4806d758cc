"""Attempt tokens: a signed, short-lived token scoped to one `(task_id, attempt)`.

Invariants:
  * A claim issues one per claimed attempt, valid until the attempt's hard deadline plus one lease
    (a late reply of the attempt may still land), never longer.
  * An attempt token authorizes only calls naming its own `task_id` and `attempt`: `permits`
    answers False for any other task or attempt, and the routes that accept it are exactly those
    a running attempt makes (heartbeat, events, steps, completion).
  * Its audience (`taskplat-attempt`) differs from every other token's, so no other token of the
    platform passes for one, even signed with the same secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from taskplat.common.tokens.keys import InvalidToken, KeyRing, TokenKeySettings

AUDIENCE = "taskplat-attempt"


@dataclass(frozen=True)
class AttemptScope:
    task_id: UUID
    attempt: int
    expires_at: int

    def permits(self, task_id: UUID, attempt: int) -> bool:
        return self.task_id == task_id and self.attempt == attempt


def attempt_key_ring(settings: TokenKeySettings) -> KeyRing:
    return KeyRing(settings, audience=AUDIENCE)


def issue_attempt_token(
    ring: KeyRing, task_id: UUID, attempt: int, *, now: datetime, expires_at: datetime
) -> str:
    claims = {"sub": str(task_id), "attempt": attempt}
    return ring.sign(claims, issued_at=now, expires_at=expires_at)


def verify_attempt_token(ring: KeyRing, token: str, *, now: datetime) -> AttemptScope:
    claims = ring.verify(token, now=now)
    try:
        task_id = UUID(str(claims["sub"]))
        attempt = claims["attempt"]
    except (KeyError, ValueError):
        raise InvalidToken("the token is not an attempt token") from None
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise InvalidToken("the token is not an attempt token")
    return AttemptScope(task_id, attempt, claims["exp"])
