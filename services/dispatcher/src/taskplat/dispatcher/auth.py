"""Bearer-token checks for the public (API key) and internal (worker token) routes.

Invariants: tokens are compared in constant time against every configured secret (no early exit
reveals which key nearly matched); a missing or wrong token is a 401; tokens are never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from pydantic import SecretStr
from starlette.requests import Request

from taskplat.common.errors import Unauthorized


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


def require_token(request: Request, secrets: Sequence[SecretStr], *, what: str) -> None:
    token = bearer_token(request)
    if token is None or not matches_any(token, secrets):
        raise Unauthorized(f"a valid {what} is required as 'Authorization: Bearer <{what}>'")
