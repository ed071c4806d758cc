"""Signed tokens: key rings (rotation, tampering, expiry, unknown keys, audiences), attempt
scopes, and the capability a task of a DAG gets for its pinned inputs and its outputs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import jwt
import pytest
from pydantic import SecretStr, ValidationError

from taskplat.common.tokens.attempt import (
    attempt_key_ring,
    issue_attempt_token,
    verify_attempt_token,
)
from taskplat.common.tokens.capability import (
    Capability,
    StorageLayout,
    build_capability,
    capability_key_ring,
    issue_capability_token,
    split_s3_uri,
    verify_capability_token,
)
from taskplat.common.tokens.keys import (
    InvalidToken,
    KeyRing,
    TokenKeySettings,
    derived_key_settings,
)

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
LATER = NOW + timedelta(minutes=10)
K1, K2 = "a" * 32, "b" * 32
TASK = UUID("11111111-1111-4111-8111-111111111111")
BLOCKS = UUID("22222222-2222-4222-8222-222222222222")
BLOCKS_V2 = UUID("33333333-3333-4333-8333-333333333333")
ALERTS = UUID("44444444-4444-4444-8444-444444444444")
ALERTS_V1 = UUID("55555555-5555-4555-8555-555555555555")
ENRICHED = UUID("66666666-6666-4666-8666-666666666666")
ENRICHED_V1 = UUID("77777777-7777-4777-8777-777777777777")


def keys(active: str, **secrets: str) -> TokenKeySettings:
    return TokenKeySettings(keys={k: SecretStr(v) for k, v in secrets.items()}, active_kid=active)


def test_rotation_two_keys_verify_the_active_one_signs() -> None:
    old = attempt_key_ring(keys("k1", k1=K1))
    rotating = attempt_key_ring(keys("k2", k1=K1, k2=K2))
    rotated = attempt_key_ring(keys("k2", k2=K2))
    token_1 = issue_attempt_token(old, TASK, 1, now=NOW, expires_at=LATER)
    token_2 = issue_attempt_token(rotating, TASK, 1, now=NOW, expires_at=LATER)
    assert jwt.get_unverified_header(token_2)["kid"] == "k2"
    assert verify_attempt_token(rotating, token_1, now=NOW).permits(TASK, 1)
    assert verify_attempt_token(rotated, token_2, now=NOW).permits(TASK, 1)
    with pytest.raises(InvalidToken, match="unknown key"):
        verify_attempt_token(rotated, token_1, now=NOW)


def test_a_token_is_pyjwt_s_encoding_byte_for_byte() -> None:
    ring = KeyRing(keys("k2", k1=K1, k2=K2), audience="taskplat-attempt")
    claims = {"sub": str(TASK), "att": 3, "text": "é"}
    for _ in range(2):  # the second signature uses the key prepared by the first
        token = ring.sign(claims, issued_at=NOW, expires_at=LATER)
        expected = jwt.encode(
            {**claims, "aud": "taskplat-attempt", "iat": int(NOW.timestamp()),
             "exp": int(LATER.timestamp())},
            K2, algorithm="HS256", headers={"kid": "k2"},
        )  # fmt: skip
        assert token == expected
    assert ring.verify(token, now=NOW)["att"] == 3


def test_expired_tampered_and_foreign_tokens_are_invalid() -> None:
    ring = attempt_key_ring(keys("k1", k1=K1))
    token = issue_attempt_token(ring, TASK, 3, now=NOW, expires_at=LATER)
    scope = verify_attempt_token(ring, token, now=LATER - timedelta(seconds=1))
    assert scope.permits(TASK, 3) and not scope.permits(TASK, 2)
    with pytest.raises(InvalidToken, match="expired"):
        verify_attempt_token(ring, token, now=LATER)
    forged = jwt.encode(
        {"sub": str(TASK), "attempt": 3, "aud": "taskplat-attempt", "iat": 1, "exp": 2**40},
        "c" * 32,
        algorithm="HS256",
        headers={"kid": "k1"},
    )
    for bad in (forged, token[:-3] + "AAA", "not-a-jwt", ""):
        with pytest.raises(InvalidToken):
            verify_attempt_token(ring, bad, now=NOW)
    unsigned = jwt.encode(
        {"sub": str(TASK), "attempt": 3, "aud": "taskplat-attempt", "iat": 1, "exp": 2**40},
        None,
        algorithm="none",
        headers={"kid": "k1"},
    )
    with pytest.raises(InvalidToken):
        verify_attempt_token(ring, unsigned, now=NOW)
    # The same secret for another audience: a capability token never passes for an attempt one.
    capability = build_capability(TASK, 3, [], [], layout=StorageLayout("lake"))
    cap_token = issue_capability_token(
        capability_key_ring(keys("k1", k1=K1)), capability, now=NOW, expires_at=LATER
    )
    with pytest.raises(InvalidToken):
        verify_attempt_token(ring, cap_token, now=NOW)
    with pytest.raises(InvalidToken):
        verify_capability_token(capability_key_ring(keys("k1", k1=K1)), token, now=NOW)


def test_key_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="32 bytes"):
        keys("k1", k1="short")
    with pytest.raises(ValidationError, match="not one of the keys"):
        keys("k9", k1=K1)
    with pytest.raises(ValidationError, match="JSON object"):
        TokenKeySettings.model_validate({"keys": "{", "active_kid": "k1"})
    derived = derived_key_settings(SecretStr("worker-token-0123456789"), kid="w", purpose="p")
    assert derived.keys["w"].get_secret_value() != "worker-token-0123456789"
    assert isinstance(KeyRing(derived, audience="x").active_kid, str)


def test_capability_of_a_dag_task_with_pinned_inputs() -> None:
    """A `transform` task of the README's pipeline example: woken by a `blocks` event (cursor)
    and reading `alert_events` with a filter; it writes `alert_events_enriched`."""
    inputs: list[object] = [
        {"dataset_uuid": str(BLOCKS), "dataset_version": str(BLOCKS_V2), "cursor": 12345},
        {
            "dataset_uuid": str(ALERTS),
            "dataset_version": str(ALERTS_V1),
            "partition_key": "100-199",
            "start": 100,
            "end": 199,
            "where": "severity = 'critical'",
        },
        {"note": "free-form input data grants nothing"},
        {"dataset_uuid": "not-a-uuid", "dataset_version": str(BLOCKS_V2)},
    ]
    outputs = [
        {
            "output_index": 0,
            "dataset_uuid": str(ENRICHED),
            "dataset_version": str(ENRICHED_V1),
            "location": "postgres_table:dataset_x",
        }
    ]
    locations = {ALERTS: "s3://archive/alerts"}  # a dataset stored elsewhere

    def resolve(dataset: UUID, version: UUID) -> str:
        return locations.get(dataset) or StorageLayout("lake").dataset_prefix(dataset, version)

    capability = build_capability(
        TASK, 2, inputs, outputs, layout=StorageLayout("lake"), resolve=resolve
    )
    assert capability.model_dump(mode="json") == {
        "task_id": str(TASK),
        "attempt": 2,
        "inputs": [
            {
                "dataset_uuid": str(BLOCKS),
                "dataset_version": str(BLOCKS_V2),
                "location": f"s3://lake/dataset/{BLOCKS}/version/{BLOCKS_V2}/",
                "cursor": 12345,
                "partition_key": None,
                "start": None,
                "end": None,
                "where": None,
            },
            {
                "dataset_uuid": str(ALERTS),
                "dataset_version": str(ALERTS_V1),
                "location": "s3://archive/alerts/",
                "cursor": None,
                "partition_key": "100-199",
                "start": 100,
                "end": 199,
                "where": "severity = 'critical'",
            },
        ],
        "outputs": [
            {
                "output_index": 0,
                "dataset_uuid": str(ENRICHED),
                "dataset_version": str(ENRICHED_V1),
                "prefix": f"s3://lake/dataset/{ENRICHED}/version/{ENRICHED_V1}/",
            }
        ],
        "scratch_prefix": f"s3://lake/scratch/{TASK}/2/",
    }
    assert capability.read_prefixes() == [
        "s3://archive/alerts/",
        f"s3://lake/dataset/{BLOCKS}/version/{BLOCKS_V2}/",
    ]
    assert capability.write_prefixes() == [
        f"s3://lake/dataset/{ENRICHED}/version/{ENRICHED_V1}/",
        f"s3://lake/scratch/{TASK}/2/",
    ]
    ring = capability_key_ring(keys("c1", c1=K1))
    token = issue_capability_token(ring, capability, now=NOW, expires_at=LATER)
    verified = verify_capability_token(ring, token, now=NOW)
    assert verified.capability == capability
    assert (verified.expires_at, verified.kid) == (int(LATER.timestamp()), "c1")
    assert isinstance(verified.capability, Capability)


def test_split_s3_uri() -> None:
    assert split_s3_uri("s3://lake/dataset/x/") == ("lake", "dataset/x/")
    with pytest.raises(ValueError):
        split_s3_uri("postgres_table:x")
