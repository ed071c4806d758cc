"""Signed tokens: key rings (rotation, tampering, expiry, unknown keys, audiences), attempt
scopes, and the capability a task of a DAG gets for its pinned inputs and its outputs."""

from __future__ import annotations

import json
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
    private_key_pem,
    verifier_key_settings,
)

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
LATER = NOW + timedelta(minutes=10)
K1, K2 = private_key_pem(b"\x01" * 32), private_key_pem(b"\x02" * 32)
HS = "h" * 32  # a legacy HS256 secret
TASK = UUID("11111111-1111-4111-8111-111111111111")
BLOCKS = UUID("22222222-2222-4222-8222-222222222222")
BLOCKS_V2 = UUID("33333333-3333-4333-8333-333333333333")
ALERTS = UUID("44444444-4444-4444-8444-444444444444")
ALERTS_V1 = UUID("55555555-5555-4555-8555-555555555555")
ENRICHED = UUID("66666666-6666-4666-8666-666666666666")
ENRICHED_V1 = UUID("77777777-7777-4777-8777-777777777777")


def keys(active: str | None, **secrets: str) -> TokenKeySettings:
    return TokenKeySettings(keys={k: SecretStr(v) for k, v in secrets.items()}, active_kid=active)


def hs256_token(claims: dict[str, object], secret: str = HS, kid: str = "h1") -> str:
    """A token as the platform signed it before Ed25519: PyJWT's HS256 of the same claims."""
    return jwt.encode(claims, secret, algorithm="HS256", headers={"kid": kid})


def test_rotation_two_keys_verify_the_active_one_signs() -> None:
    old = attempt_key_ring(keys("k1", k1=K1))
    rotating = attempt_key_ring(keys("k2", k1=K1, k2=K2))
    rotated = attempt_key_ring(keys("k2", k2=K2))
    token_1 = issue_attempt_token(old, TASK, 1, now=NOW, expires_at=LATER)
    token_2 = issue_attempt_token(rotating, TASK, 1, now=NOW, expires_at=LATER)
    assert jwt.get_unverified_header(token_2) == {"alg": "EdDSA", "kid": "k2", "typ": "JWT"}
    assert verify_attempt_token(rotating, token_1, now=NOW).permits(TASK, 1)
    assert verify_attempt_token(rotated, token_2, now=NOW).permits(TASK, 1)
    with pytest.raises(InvalidToken, match="unknown key"):
        verify_attempt_token(rotated, token_1, now=NOW)


def test_a_verifier_holds_public_keys_and_verifies_what_the_signer_signs() -> None:
    signer = keys("k2", k1=K1, k2=K2)
    public = signer.public()
    assert public.active_kid is None
    assert {signer.kind(k) for k in signer.keys} == {"private"}
    assert {public.kind(k) for k in public.keys} == {"public"}
    assert all("PRIVATE" not in v.get_secret_value() for v in public.keys.values())
    token = issue_capability_token(
        capability_key_ring(signer),
        build_capability(TASK, 1, [], [], layout=StorageLayout("lake")),
        now=NOW,
        expires_at=LATER,
    )
    verifier = capability_key_ring(verifier_key_settings(public.keys, what="capability keys"))
    assert verify_capability_token(verifier, token, now=NOW).capability.task_id == TASK
    with pytest.raises(RuntimeError, match="only verifies"):
        verifier.sign({}, issued_at=NOW, expires_at=LATER)
    # A verifier given a private key refuses to start: holding it, it could mint tokens.
    with pytest.raises(ValueError, match="'k1' is a private key"):
        verifier_key_settings(signer.keys, what="capability keys")
    with pytest.raises(ValueError, match="required"):
        verifier_key_settings(None, what="capability keys")


def test_hs256_tokens_in_flight_verify_during_the_rotation_window_only() -> None:
    """Moving off HS256: the verifiers first list the old secret and the new public key, then the
    signers sign with the new Ed25519 key; a token signed with HS256 before the switch still
    verifies while its secret is listed, and is refused once the window ends (the secret is
    removed everywhere)."""
    claims = {"sub": str(TASK), "attempt": 1, "aud": "taskplat-attempt",
              "iat": int(NOW.timestamp()), "exp": int(LATER.timestamp())}  # fmt: skip
    before_switch = hs256_token(claims)
    during = keys("k2", h1=HS, k2=K2)
    assert during.kind("h1") == "hs256"
    during_ring = attempt_key_ring(during)
    assert verify_attempt_token(during_ring, before_switch, now=NOW).permits(TASK, 1)
    after_switch = issue_attempt_token(during_ring, TASK, 1, now=NOW, expires_at=LATER)
    assert jwt.get_unverified_header(after_switch)["alg"] == "EdDSA"
    # The verifiers' side of the window: the old secret and the new public key.
    verifier = attempt_key_ring(verifier_key_settings(during.public().keys, what="keys"))
    assert verify_attempt_token(verifier, before_switch, now=NOW).permits(TASK, 1)
    assert verify_attempt_token(verifier, after_switch, now=NOW).permits(TASK, 1)
    after_window = attempt_key_ring(keys("k2", k2=K2))
    with pytest.raises(InvalidToken, match="unknown key"):
        verify_attempt_token(after_window, before_switch, now=NOW)
    assert verify_attempt_token(after_window, after_switch, now=NOW).permits(TASK, 1)
    # An HS256 secret never signs.
    with pytest.raises(ValidationError, match="must be an Ed25519 private key"):
        keys("h1", h1=HS, k2=K2)


def test_algorithm_confusion_is_refused() -> None:
    """The algorithm comes from the key the `kid` names: an HS256 token whose secret is the
    Ed25519 public key's PEM (a verifier's key is public), or an HS256 token under an Ed25519
    key id, never verifies; nor an EdDSA token under a legacy key id."""
    ring = attempt_key_ring(keys("k1", h1=HS, k1=K1))
    claims = {"sub": str(TASK), "attempt": 1, "aud": "taskplat-attempt", "iat": 1, "exp": 2**40}
    public_pem = keys(None, k1=K1).public().keys["k1"].get_secret_value()
    forged = jwt.api_jws.PyJWS()
    forged._algorithms["HS256"].prepare_key = lambda key: key  # type: ignore[method-assign]
    body = json.dumps(claims, separators=(",", ":")).encode()
    confused = forged.encode(body, public_pem.encode(), algorithm="HS256", headers={"kid": "k1"})
    with pytest.raises(InvalidToken, match="signature"):
        verify_attempt_token(ring, confused, now=NOW)
    with pytest.raises(InvalidToken, match="signature"):
        verify_attempt_token(ring, hs256_token(claims, kid="k1"), now=NOW)
    eddsa_under_legacy = jwt.encode(claims, K1, algorithm="EdDSA", headers={"kid": "h1"})
    with pytest.raises(InvalidToken, match="signature"):
        verify_attempt_token(ring, eddsa_under_legacy, now=NOW)


def test_a_token_is_pyjwt_s_encoding_byte_for_byte() -> None:
    ring = KeyRing(keys("k2", k1=K1, k2=K2), audience="taskplat-attempt")
    claims = {"sub": str(TASK), "att": 3, "text": "é"}
    for _ in range(2):
        token = ring.sign(claims, issued_at=NOW, expires_at=LATER)
        expected = jwt.encode(
            {**claims, "aud": "taskplat-attempt", "iat": int(NOW.timestamp()),
             "exp": int(LATER.timestamp())},
            K2, algorithm="EdDSA", headers={"kid": "k2"},
        )  # fmt: skip
        assert token == expected  # Ed25519 signatures are deterministic
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
        private_key_pem(b"\x09" * 32),
        algorithm="EdDSA",
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
    # The same key for another audience: a capability token never passes for an attempt one.
    capability = build_capability(TASK, 3, [], [], layout=StorageLayout("lake"))
    cap_token = issue_capability_token(
        capability_key_ring(keys("k1", k1=K1)), capability, now=NOW, expires_at=LATER
    )
    with pytest.raises(InvalidToken):
        verify_attempt_token(ring, cap_token, now=NOW)
    with pytest.raises(InvalidToken):
        verify_capability_token(capability_key_ring(keys("k1", k1=K1)), token, now=NOW)


def test_key_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="neither an Ed25519 PEM key nor an HS256 secret"):
        keys("k1", k1="short")
    with pytest.raises(ValidationError, match="not one of the keys"):
        keys("k9", k1=K1)
    with pytest.raises(ValidationError, match="JSON object"):
        TokenKeySettings.model_validate({"keys": "{", "active_kid": "k1"})
    rsa = rsa_pem()
    with pytest.raises(ValidationError, match="not an Ed25519 private"):
        keys(None, r1=rsa)
    with pytest.raises(ValidationError, match="not an Ed25519 private"):
        keys(None, r1="-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    derived = derived_key_settings(SecretStr("worker-token-0123456789"), kid="w", purpose="p")
    again = derived_key_settings(SecretStr("worker-token-0123456789"), kid="w", purpose="p")
    assert derived.kind("w") == "private" and derived == again
    assert isinstance(KeyRing(derived, audience="x").active_kid, str)


def rsa_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


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
