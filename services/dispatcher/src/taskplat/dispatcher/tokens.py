"""The dispatcher's signed tokens: the attempt token of every claim, the capability token of an
untrusted claim, and the check of an attempt token presented on an internal route.

Invariants:
  * Both tokens of a claim are issued from the claimed row alone (committed values): issued at the
    claim's `started_at`, expiring one lease after the attempt's `deadline_at`.
  * A task is untrusted when its row says `trust = 'untrusted'` (a job's trust) or its operator is
    one of the `untrusted_operators` setting; only untrusted claims carry a capability token, and
    only when capability keys are configured.
  * Attempt and capability tokens have their own key rings and audiences: neither passes for the
    other, and the credential broker, which holds the capability keys, cannot mint attempt tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from taskplat.common.claim_answer import attempt_token, capability_token
from taskplat.common.clock import Clock
from taskplat.common.contracts.internal import Trust
from taskplat.common.tokens.attempt import (
    AttemptScope,
    attempt_key_ring,
    verify_attempt_token,
)
from taskplat.common.tokens.capability import (
    StorageLayout,
    capability_key_ring,
)
from taskplat.dispatcher.settings import DispatcherSettings

Row = Mapping[str, Any]


class TokenIssuer:
    def __init__(self, settings: DispatcherSettings, clock: Clock) -> None:
        self._attempts = attempt_key_ring(settings.attempt_token_key_settings())
        capability_keys = settings.capability_token_key_settings()
        self._capabilities = capability_key_ring(capability_keys) if capability_keys else None
        self._layout = StorageLayout(settings.data_bucket)
        self._lease = timedelta(seconds=settings.lease_ttl_seconds)
        self._untrusted = frozenset(settings.untrusted_operators)
        self._clock = clock

    def trust(self, row: Row) -> Trust:
        if row.get("trust") == "untrusted" or row["operator"] in self._untrusted:
            return "untrusted"
        return "trusted"

    def attempt_token(self, row: Row) -> str:
        return attempt_token(self._attempts, row, self._lease)

    def capability_token(self, row: Row) -> str | None:
        if self._capabilities is None or self.trust(row) != "untrusted":
            return None
        return capability_token(self._capabilities, row, self._layout, self._lease)

    def verify_attempt(self, token: str) -> AttemptScope:
        """The scope of a valid attempt token, else `InvalidToken` (401)."""
        return verify_attempt_token(self._attempts, token, now=self._clock.now())
