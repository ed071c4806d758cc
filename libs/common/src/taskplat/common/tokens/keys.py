"""Key rings of signed tokens: JWTs signed with Ed25519 (`EdDSA`) whose header names the key id
(`kid`) they were signed with (docs/security.md, "Signing keys").

Invariants:
  * A key of a ring is one of: an Ed25519 private key (PEM, PKCS#8: signs and verifies), an
    Ed25519 public key (PEM, SubjectPublicKeyInfo: verifies only), or a legacy HS256 secret of 32+
    bytes (verifies only, during the rotation window that moves a deployment off HS256). A PEM of
    any other key type is refused.
  * Each key id is bound to one algorithm: verification takes the algorithm from the key the
    token's `kid` names, never from the token, so `none`, an HS256 token under an Ed25519 key id
    (the public key used as an HMAC secret) or the reverse never verifies.
  * A token is signed with the ring's active key only, which must be an Ed25519 private key;
    a ring without an active key (the verifiers: broker, query service) cannot sign. Verification
    accepts any key of the ring, so during a rotation two keys are accepted at once.
  * Verification requires `kid`, `exp`, `iat` and the ring's audience; an expired, tampered,
    unknown-key or other-audience token raises `InvalidToken` (an `Unauthorized`), never
    anything else.
  * Keys are `SecretStr` (public keys too, for one code path); they are never logged nor put in
    an error.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from taskplat.common.errors import Unauthorized

ALGORITHM = "EdDSA"
LEGACY_ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32
KeyId = str
_PEM = "-----BEGIN "


class InvalidToken(Unauthorized):
    """A token that is malformed, tampered, expired, signed by an unknown key or for another use."""

    code = "invalid_token"


@dataclass(frozen=True)
class _Key:
    algorithm: str
    verifying: Ed25519PublicKey | bytes
    signing: Ed25519PrivateKey | None = None


def _load(kid: KeyId, text: str) -> _Key:
    """The key of `text`, or ValueError naming `kid` (never the key)."""
    if not text.lstrip().startswith(_PEM):
        if len(text.encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"the key {kid!r} is neither an Ed25519 PEM key nor an HS256 secret of at "
                "least 32 bytes"
            )
        return _Key(LEGACY_ALGORITHM, text.encode())
    data = text.strip().encode()
    try:
        if b"PRIVATE KEY" in data.split(b"\n", 1)[0]:
            private = serialization.load_pem_private_key(data, password=None)
            if not isinstance(private, Ed25519PrivateKey):
                raise ValueError
            return _Key(ALGORITHM, private.public_key(), private)
        public = serialization.load_pem_public_key(data)
        if not isinstance(public, Ed25519PublicKey):
            raise ValueError
        return _Key(ALGORITHM, public)
    except (ValueError, TypeError):
        raise ValueError(
            f"the key {kid!r} is not an Ed25519 private (PKCS#8) or public PEM key"
        ) from None


class TokenKeySettings(BaseModel):
    """The keys of one kind of token: `{kid: key}` (one or two during a rotation) and, for a
    signer, the id of the Ed25519 private key that signs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: dict[KeyId, SecretStr] = Field(min_length=1, max_length=4)
    active_kid: KeyId | None = None

    @field_validator("keys", mode="before")
    @classmethod
    def _parse_json(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError('must be a JSON object {"<kid>": "<key>"}') from None
        return value

    @field_validator("keys")
    @classmethod
    def _valid(cls, value: dict[KeyId, SecretStr]) -> dict[KeyId, SecretStr]:
        for kid, key in value.items():
            if not kid or len(kid) > 64:
                raise ValueError("a key id has 1 to 64 characters")
            _load(kid, key.get_secret_value())
        return value

    @model_validator(mode="after")
    def _active_signs(self) -> TokenKeySettings:
        if self.active_kid is None:
            return self
        if self.active_kid not in self.keys:
            raise ValueError(f"active key id {self.active_kid!r} is not one of the keys")
        if self.kind(self.active_kid) != "private":
            raise ValueError(
                f"the active key {self.active_kid!r} must be an Ed25519 private key (PEM): "
                "tokens are signed with Ed25519 only"
            )
        return self

    def kind(self, kid: KeyId) -> str:
        """`private`, `public` (Ed25519) or `hs256` (a legacy secret, verification only)."""
        key = _load(kid, self.keys[kid].get_secret_value())
        if key.algorithm == LEGACY_ALGORITHM:
            return "hs256"
        return "private" if key.signing is not None else "public"

    def public(self) -> TokenKeySettings:
        """What a verifier holds: each Ed25519 key's public half (legacy secrets as they are),
        no active key."""
        return TokenKeySettings(
            keys={kid: SecretStr(_public_text(kid, key)) for kid, key in self.keys.items()}
        )


def _public_text(kid: KeyId, key: SecretStr) -> str:
    loaded = _load(kid, key.get_secret_value())
    if loaded.algorithm == LEGACY_ALGORITHM:
        return key.get_secret_value()
    assert isinstance(loaded.verifying, Ed25519PublicKey)
    return public_key_pem(loaded.verifying)


def public_key_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def private_key_pem(seed: bytes | None = None) -> str:
    """A new Ed25519 private key in PEM (PKCS#8); from a 32-byte `seed` when given."""
    key = Ed25519PrivateKey.from_private_bytes(seed) if seed else Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


class KeyRing:
    """Signs with the active key and verifies with any key of the ring, for one audience."""

    def __init__(self, settings: TokenKeySettings, *, audience: str) -> None:
        self._keys = {
            kid: _load(kid, secret.get_secret_value()) for kid, secret in settings.keys.items()
        }
        self._active = settings.active_kid
        self.audience = audience
        self._signer = jwt.PyJWS(algorithms=[ALGORITHM])

    @property
    def active_kid(self) -> KeyId:
        if self._active is None:
            raise RuntimeError("this key ring only verifies: it has no active (private) key")
        return self._active

    def kid_of(self, token: str) -> KeyId:
        """The key id a token names (only meaningful once `verify` accepted it)."""
        kid = jwt.get_unverified_header(token).get("kid")
        return str(kid)

    def sign(self, claims: Mapping[str, Any], *, issued_at: datetime, expires_at: datetime) -> str:
        kid = self.active_kid
        signing = self._keys[kid].signing
        assert signing is not None  # the settings checked that the active key is private
        payload = {
            **claims,
            "aud": self.audience,
            "iat": int(issued_at.timestamp()),
            "exp": int(expires_at.timestamp()),
        }
        # What `jwt.encode` signs: the claims as compact JSON, the header sorted.
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        return self._signer.encode(body, signing, algorithm=ALGORITHM, headers={"kid": kid})

    def verify(self, token: str, *, now: datetime) -> dict[str, Any]:
        """The token's claims, or `InvalidToken`. `now` is the verifier's clock (tests: fake)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("the token is not a well-formed JWT") from None
        kid = header.get("kid")
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise InvalidToken("the token is signed by an unknown key")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.verifying,
                algorithms=[key.algorithm],
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
    """A signer's key settings of `keys` + `active_kid` (None when neither is set); a half-set or
    invalid pair raises `ValueError` naming `what`."""
    if keys is None and active_kid is None:
        return None
    if keys is None or active_kid is None:
        raise ValueError(f"{what}: set both the keys and the active key id, or neither")
    return TokenKeySettings(keys=dict(keys), active_kid=active_kid)


def verifier_key_settings(keys: Mapping[str, SecretStr] | None, *, what: str) -> TokenKeySettings:
    """A verifier's key settings: public keys (and legacy HS256 secrets during a rotation window)
    only; a private key raises `ValueError` naming its id and `what` (a verifier that held one
    could mint tokens)."""
    if not keys:
        raise ValueError(f"{what} are required (Ed25519 public keys, PEM)")
    settings = TokenKeySettings(keys=dict(keys))
    for kid in settings.keys:
        if settings.kind(kid) == "private":
            raise ValueError(
                f"{what}: key {kid!r} is a private key; a verifier holds public keys only "
                "(`openssl pkey -pubout` gives the public half)"
            )
    return settings


def derived_key_settings(secret: SecretStr, *, kid: str, purpose: str) -> TokenKeySettings:
    """A single Ed25519 key derived from another secret (its seed: HMAC-SHA256 of `purpose`)."""
    seed = hmac.new(secret.get_secret_value().encode(), purpose.encode(), hashlib.sha256)
    return TokenKeySettings(keys={kid: SecretStr(private_key_pem(seed.digest()))}, active_kid=kid)
