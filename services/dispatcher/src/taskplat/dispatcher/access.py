"""Scoped API keys: who a bearer token is, and what it may do.

Invariants:
  * A key is `read`, `submit`, `operate` and/or `admin`; `admin` holds every scope. Each public
    route declares the one scope it needs (`route_table.SCOPES`); a valid key without it answers
    403 naming the scope, an unknown key 401.
  * The bootstrap keys of the `api_keys` setting are admin keys named `bootstrap`, compared in
    constant time against every one of them. Stored keys are found by the sha256 of the token
    (a high-entropy secret made here, so the hash is as unguessable as the token); the token
    itself is never stored nor logged.
  * A replica caches each stored lookup (found or not) for `key_cache_seconds`: a revoked key
    or a changed scope takes effect within that time on every replica, at once on the replica
    that revoked it.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool
from pydantic import SecretStr

from taskplat.common.contracts.access import SCOPES, Scope
from taskplat.dispatcher.auth import matches_any
from taskplat.dispatcher.repository import access as repo

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]
BOOTSTRAP = "bootstrap"
KEY_PREFIX = "tpk_"
CACHE_MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Identity:
    """The key behind a call: its name and scopes."""

    name: str
    scopes: frozenset[Scope]

    def allows(self, scope: Scope) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    def effective_scopes(self) -> list[Scope]:
        return [scope for scope in SCOPES if self.allows(scope)]


BOOTSTRAP_IDENTITY = Identity(BOOTSTRAP, frozenset(SCOPES))


def new_secret() -> str:
    """A new key's token: 256 random bits, recognisable by its prefix."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class KeyStore:
    """Finds the identity of a bearer token: a bootstrap key, or a stored key (cached)."""

    def __init__(self, pool: Pool, bootstrap: Sequence[SecretStr], cache_seconds: float) -> None:
        self._pool = pool
        self._bootstrap = list(bootstrap)
        self._cache_seconds = cache_seconds
        self._cache: dict[bytes, tuple[float, Identity | None]] = {}

    async def identify(self, token: str) -> Identity | None:
        if matches_any(token, self._bootstrap):
            return BOOTSTRAP_IDENTITY
        digest = key_hash(token)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        async with self._pool.connection() as conn:
            row = await repo.find_key(conn, digest)
        identity = Identity(row["name"], frozenset(row["scopes"])) if row is not None else None
        if self._cache_seconds > 0:
            if len(self._cache) >= CACHE_MAX_ENTRIES:
                self._cache.clear()
            self._cache[digest] = (now + self._cache_seconds, identity)
        return identity

    def forget(self, name: str) -> None:
        """Drop the cached lookups of key `name` (after its revocation on this replica)."""
        for digest, (_, identity) in list(self._cache.items()):
            if identity is not None and identity.name == name:
                del self._cache[digest]
