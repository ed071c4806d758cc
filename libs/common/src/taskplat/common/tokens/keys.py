"""Key rings of signed tokens: JWTs (HS256) whose header names the key id (`kid`) they were signed
with.

Invariants:
  * A token is signed with the ring's active key only; it verifies with any key of the ring, so
    during a rotation two keys are accepted at once (the new one signs, the old one still verifies
    tokens issued before the switch).
  * Verification pins the algorithm (HS256, never `none` nor one the token names), requires
    `kid`, `exp`, `iat` and the ring's audience; an expired, tampered, unknown-key or
    other-audience token raises `InvalidToken` (an `Unauthorized`), never anything else.
  * Secrets are `SecretStr` and at least 32 bytes; they are never logged nor put in an error.
  * A token is PyJWT's `jwt.encode` of the same claims and header, byte for byte; signing only
    skips PyJWT's re-examination of the key on each call (its check that an HMAC secret is not a
    PEM or SSH public key, done once per key here: the claims path signs one token per task).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jwt
from jwt.algorithms import HMACAlgorithm
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from taskplat.common.errors import Unauthorized

ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32
KeyId = str


class InvalidToken(Unauthorized):
    """A token that is malformed, tampered, expired, signed by an unknown key or for another use."""

    code = "invalid_token"


class TokenKeySettings(BaseModel):
    """The keys of one kind of token: `{kid: secret}` (one or two during a rotation) and the id of
    the key that signs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: dict[KeyId, SecretStr] = Field(min_length=1, max_length=4)
    active_kid: KeyId

    @field_validator("keys", mode="before")
    @classmethod
    def _parse_json(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError('must be a JSON object {"<kid>": "<secret>"}') from None
        return value

    @field_validator("keys")
    @classmethod
    def _strong(cls, value: dict[KeyId, SecretStr]) -> dict[KeyId, SecretStr]:
        for kid, secret in value.items():
            if not kid or len(kid) > 64:
                raise ValueError("a key id has 1 to 64 characters")
            if len(secret.get_secret_value().encode()) < MIN_SECRET_BYTES:
                raise ValueError(f"the secret of key {kid!r} must be at least 32 bytes")
        return value

    @model_validator(mode="after")
    def _active_known(self) -> TokenKeySettings:
        if self.active_kid not in self.keys:
            raise ValueError(f"active key id {self.active_kid!r} is not one of the keys")
        return self


class _OncePreparedHmac(HMACAlgorithm):
    """PyJWT's HS256, each key prepared (and checked) once: the ring's keys are a fixed few."""

    def __init__(self) -> None:
        super().__init__(HMACAlgorithm.SHA256)
        self._prepared: dict[str | bytes, bytes] = {}

    def prepare_key(self, key: str | bytes) -> bytes:
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepared[key] = super().prepare_key(key)
        return prepared


class KeyRing:
    """Signs with the active key and verifies with any key of the ring, for one audience."""

    def __init__(self, settings: TokenKeySettings, *, audience: str) -> None:
        self._keys = {kid: secret.get_secret_value() for kid, secret in settings.keys.items()}
        self._active = settings.active_kid
        self.audience = audience
        self._signer = jwt.PyJWS(algorithms=[])
        self._signer.register_algorithm(ALGORITHM, _OncePreparedHmac())

    @property
    def active_kid(self) -> KeyId:
        return self._active

    def kid_of(self, token: str) -> KeyId:
        """The key id a token names (only meaningful once `verify` accepted it)."""
        kid = jwt.get_unverified_header(token).get("kid")
        return str(kid)

    def sign(self, claims: Mapping[str, Any], *, issued_at: datetime, expires_at: datetime) -> str:
        payload = {
            **claims,
            "aud": self.audience,
            "iat": int(issued_at.timestamp()),
            "exp": int(expires_at.timestamp()),
        }
        # What `jwt.encode` signs: the claims as compact JSON, the header sorted.
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return self._signer.encode(
            body, self._keys[self._active], algorithm=ALGORITHM, headers={"kid": self._active}
        )

    def verify(self, token: str, *, now: datetime) -> dict[str, Any]:
        """The token's claims, or `InvalidToken`. `now` is the verifier's clock (tests: fake)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("the token is not a well-formed JWT") from None
        kid = header.get("kid")
        if not isinstance(kid, str) or kid not in self._keys:
            raise InvalidToken("the token is signed by an unknown key")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._keys[kid],
                algorithms=[ALGORITHM],
                audience=self.audience,
                options={
                    "require": ["exp", "iat", "aud"],
                    # Time is checked below against the caller's clock, not the system's.
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.PyJWTError:
            raise InvalidToken("the token's signature or claims are invalid") from None
        if not isinstance(claims.get("exp"), int) or claims["exp"] <= now.timestamp():
            raise InvalidToken("the token has expired")
        return claims


def key_settings(
    keys: Mapping[str, SecretStr] | None, active_kid: str | None, *, what: str
) -> TokenKeySettings | None:
    """The key settings of `keys` + `active_kid` (None when neither is set); a half-set or invalid
    pair raises `ValueError` naming `what`."""
    if keys is None and active_kid is None:
        return None
    if keys is None or active_kid is None:
        raise ValueError(f"{what}: set both the keys and the active key id, or neither")
    return TokenKeySettings(keys=dict(keys), active_kid=active_kid)


def derived_key_settings(secret: SecretStr, *, kid: str, purpose: str) -> TokenKeySettings:
    """A single-key ring derived from another secret (HMAC-SHA256 of `purpose`)."""
    derived = hmac.new(secret.get_secret_value().encode(), purpose.encode(), hashlib.sha256)
    return TokenKeySettings(keys={kid: SecretStr(derived.hexdigest())}, active_kid=kid)
