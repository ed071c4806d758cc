"""The service remembers the tokens it verified: a remembered token still expires on time, a token
differing by one character is verified on its own, and the memory is bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr
from query_harness import KEY, mint, public_key

from taskplat.common.tokens.capability import capability_key_ring
from taskplat.common.tokens.keys import InvalidToken, TokenKeySettings, private_key_pem
from taskplat.query_service.verified import VerifiedTokens

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _tokens(size: int = 4096) -> VerifiedTokens:
    keys = TokenKeySettings(keys={"q1": SecretStr(public_key(KEY))})
    return VerifiedTokens(capability_key_ring(keys), size)


def test_a_remembered_token_still_expires() -> None:
    tokens = _tokens()
    token = mint([], now=NOW, life=timedelta(minutes=5))
    first = tokens.verify(token, now=NOW)
    assert tokens.verify(token, now=NOW + timedelta(minutes=4)) is first
    with pytest.raises(InvalidToken, match="expired"):
        tokens.verify(token, now=NOW + timedelta(minutes=5))
    with pytest.raises(InvalidToken, match="expired"):  # and stays refused once forgotten
        tokens.verify(token, now=NOW + timedelta(minutes=6))


def test_another_text_is_verified_on_its_own() -> None:
    tokens = _tokens()
    token = mint([], now=NOW)
    tokens.verify(token, now=NOW)
    head, payload, signature = token.split(".")
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    for forged in (
        f"{head}.{payload}.{flipped}",
        mint([], now=NOW, key=private_key_pem(b"\x79" * 32)),
    ):
        with pytest.raises(InvalidToken):
            tokens.verify(forged, now=NOW)


def test_the_memory_is_bounded() -> None:
    tokens = _tokens(size=2)
    minted = [mint([], now=NOW) for _ in range(3)]
    first = [tokens.verify(t, now=NOW) for t in minted]
    assert tokens.verify(minted[2], now=NOW) is first[2]
    assert tokens.verify(minted[0], now=NOW) is not first[0]  # dropped, verified again
