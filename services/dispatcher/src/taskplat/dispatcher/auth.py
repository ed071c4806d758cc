"""Bearer-token checks for the public (API key) and internal (worker token, attempt token) routes.

Invariants: tokens are compared in constant time against every configured secret (no early exit
reveals which key nearly matched); a missing or wrong token is a 401; tokens are never logged.
A valid attempt token is accepted only on a route marked attempt-scoped, and there only for a body
naming its own `(task_id, attempt)`; used anywhere else it answers 403 (it is a real credential,
just not one for this call); an expired, tampered or unknown-key attempt token is a 401.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, SecretStr
from starlette.requests import Request

from taskplat.common.errors import Forbidden, Unauthorized
from taskplat.common.tokens.attempt import AttemptScope
from taskplat.common.tokens.keys import InvalidToken

OUTSIDE_SCOPE = (
    "an attempt token authorizes only the heartbeat, events, steps and completion of its own "
    "attempt"
)


class AttemptVerifier(Protocol):
    def verify_attempt(self, token: str) -> AttemptScope: ...


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def matches_any(provided: str, secrets: Sequence[SecretStr]) -> bool:
    provided_bytes = provided.encode()
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(provided_bytes, secret.get_secret_value().encode())
    return matched


def authorize(
    request: Request,
    secrets: Sequence[SecretStr],
    *,
    what: str,
    attempts: AttemptVerifier,
    attempt_scoped: bool = False,
) -> AttemptScope | None:
    """Accept one of `secrets` (None) or, on an attempt-scoped route, a valid attempt token (its
    scope, which the body must then match); 403 for a valid attempt token elsewhere, 401 else."""
    token = bearer_token(request)
    if token is not None and matches_any(token, secrets):
        return None
    scope: AttemptScope | None = None
    if token is not None and token.count(".") == 2:
        try:
            scope = attempts.verify_attempt(token)
        except InvalidToken:
            scope = None
    if scope is None:
        raise Unauthorized(f"a valid {what} is required as 'Authorization: Bearer <{what}>'")
    if not attempt_scoped:
        raise Forbidden(OUTSIDE_SCOPE)
    return scope


def check_attempt_scope(scope: AttemptScope | None, body: BaseModel) -> None:
    """403 unless the body names the attempt `scope` allows (no scope: the worker token)."""
    if scope is None:
        return
    task_id, attempt = getattr(body, "task_id", None), getattr(body, "attempt", None)
    if not isinstance(attempt, int) or task_id is None or not scope.permits(task_id, attempt):
        raise Forbidden(OUTSIDE_SCOPE)
