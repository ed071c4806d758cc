"""Contracts of the credential broker (`POST /credentials`).

Invariant: the answer names the attempt it serves and the exact session policy the credentials
carry, so a caller (and a test) sees what it was granted.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pydantic import AwareDatetime, Field

from taskplat.common.contracts.base import Contract


class CredentialsRequest(Contract):
    """The body of `POST /credentials` (may be empty): the capability token is the bearer token."""


class CredentialsResponse(Contract):
    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: AwareDatetime = Field(
        description="When STS expires the credentials (at least 900 s away); the session policy "
        "refuses every call after the capability token's own expiry, `usable_until`."
    )
    usable_until: AwareDatetime
    task_id: UUID
    attempt: int
    read_prefixes: list[str]
    write_prefixes: list[str]
    policy: dict[str, Any] = Field(description="The session policy the credentials carry.")
