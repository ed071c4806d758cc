"""The query service verifies capability tokens with public keys only: a private key in its
settings is refused at start (holding one, a compromised service could mint tokens)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from query_harness import KEY, public_key, settings


def test_the_query_service_holds_public_keys_only() -> None:
    url, endpoint = "postgresql://nobody@localhost/none", "http://localhost"
    with pytest.raises(ValidationError, match="'q1' is a private key"):
        settings(url, endpoint, capability_token_keys=json.dumps({"q1": KEY}))
    held = settings(url, endpoint).token_keys()
    assert {held.kind(kid) for kid in held.keys} == {"public"} and held.active_kid is None
    assert held.keys["q1"].get_secret_value() == public_key(KEY)
