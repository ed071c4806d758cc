"""Signed tokens of Taskplat: attempt tokens (one attempt's worker calls) and capability tokens
(an untrusted task's data access). Needs the `tokens` extra (PyJWT).
"""

from taskplat.common.tokens.keys import InvalidToken, KeyRing, TokenKeySettings

__all__ = ["InvalidToken", "KeyRing", "TokenKeySettings"]
