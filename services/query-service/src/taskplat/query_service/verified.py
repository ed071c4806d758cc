"""Capability tokens this process has verified, remembered by their exact text until they expire.

Invariants:
  * The first time a token's text is seen it is verified whole (`verify_capability_token`:
    signature, key, audience, claims, expiry); a refused token is never remembered.
  * A remembered token answers the same `VerifiedCapability` without its signature being checked
    again (the key ring is fixed for the life of the process, and the same text always verifies
    the same way), but its expiry is checked on every use against the caller's clock, refused
    exactly as `verify_capability_token` refuses it.
  * At most `size` tokens are remembered; the least recently used is dropped first.
  * Only the token is remembered: whether its attempt still runs and what its inputs are is read
    from the database on every query (`inputs.lookup`).
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime

from taskplat.common.tokens.capability import VerifiedCapability, verify_capability_token
from taskplat.common.tokens.keys import InvalidToken, KeyRing


class VerifiedTokens:
    """Not thread-safe: used on the event loop's thread only."""

    def __init__(self, ring: KeyRing, size: int = 4096) -> None:
        self._ring = ring
        self._size = size
        self._known: OrderedDict[str, VerifiedCapability] = OrderedDict()

    def verify(self, token: str, *, now: datetime) -> VerifiedCapability:
        """The capability `token` states, or `InvalidToken`."""
        verified = self._known.get(token)
        if verified is None:
            verified = verify_capability_token(self._ring, token, now=now)
            self._known[token] = verified
            if len(self._known) > self._size:
                self._known.popitem(last=False)
            return verified
        if verified.expires_at <= now.timestamp():
            del self._known[token]
            raise InvalidToken("the token has expired")
        self._known.move_to_end(token)
        return verified
