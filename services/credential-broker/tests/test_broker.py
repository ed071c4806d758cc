"""`POST /credentials` against LocalStack's STS, IAM and S3: valid capability tokens get
credentials carrying exactly their session policy (asserted here: LocalStack does not enforce
IAM) that work against S3; expired, tampered, unknown-key or foreign tokens answer 401; a task
asking too often answers 429; keys rotate with two accepted at once."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jwt
import pytest
from broker_harness import (
    BUCKET,
    KEY_1,
    KEY_2,
    aws,
    broker_settings,
    make_role,
    mint,
    public,
    served,
)
from pydantic import ValidationError

from taskplat.common.clock import FakeClock
from taskplat.common.tokens.keys import private_key_pem
from taskplat.credential_broker.policy import session_policy


@pytest.fixture(scope="module")
def role_arn(sqs_endpoint_url: str) -> str:
    aws("s3", sqs_endpoint_url).create_bucket(Bucket=BUCKET)
    return make_role(sqs_endpoint_url)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.now(UTC).replace(microsecond=0))


def serve(
    endpoint: str, role_arn: str, clock: FakeClock, **overrides: Any
) -> contextlib.AbstractContextManager[httpx.Client]:
    settings = broker_settings(role_arn, endpoint, **overrides)
    return served(settings, aws("sts", endpoint), clock)


@pytest.fixture
def broker(sqs_endpoint_url: str, role_arn: str, clock: FakeClock) -> Iterator[httpx.Client]:
    with serve(sqs_endpoint_url, role_arn, clock) as client:
        yield client


def post(client: httpx.Client, token: str, **kwargs: Any) -> Any:
    return client.post("/credentials", headers={"Authorization": f"Bearer {token}"}, **kwargs)


def test_credentials_carry_exactly_the_capabilitys_policy_and_work_on_s3(
    broker: httpx.Client, sqs_endpoint_url: str, clock: FakeClock
) -> None:
    dataset, version = uuid.uuid4(), uuid.uuid4()
    minted = mint(
        clock.now(),
        inputs=[{"dataset_uuid": str(dataset), "dataset_version": str(version), "cursor": 9}],
    )
    input_key = f"dataset/{dataset}/version/{version}/part-0.parquet"
    aws("s3", sqs_endpoint_url).put_object(Bucket=BUCKET, Key=input_key, Body=b"rows")
    response = post(broker, minted.token)
    assert response.status_code == 200, response.text
    body = response.json()
    expires = int(minted.expires_at.timestamp())
    assert body["policy"] == session_policy(minted.capability, expires)
    assert body["policy"]["Statement"][0]["Resource"] == [
        f"arn:aws:s3:::{BUCKET}/dataset/{dataset}/version/{version}/*"
    ]
    assert body["read_prefixes"] == [f"s3://{BUCKET}/dataset/{dataset}/version/{version}/"]
    scratch = f"scratch/{minted.capability.task_id}/1/"
    assert body["write_prefixes"] == [f"s3://{BUCKET}/{scratch}"]
    assert (body["task_id"], body["attempt"]) == (str(minted.capability.task_id), 1)
    assert datetime.fromisoformat(body["usable_until"]) == minted.expires_at
    s3 = aws(
        "s3",
        sqs_endpoint_url,
        aws_access_key_id=body["access_key_id"],
        aws_secret_access_key=body["secret_access_key"],
        aws_session_token=body["session_token"],
    )
    assert s3.get_object(Bucket=BUCKET, Key=input_key)["Body"].read() == b"rows"
    s3.put_object(Bucket=BUCKET, Key=f"{scratch}out.json", Body=b"{}")
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=scratch)
    assert [item["Key"] for item in listed["Contents"]] == [f"{scratch}out.json"]


def test_a_token_with_less_than_stss_minimum_left_is_ended_by_the_policy(
    broker: httpx.Client, clock: FakeClock
) -> None:
    minted = mint(clock.now(), life=timedelta(minutes=2))
    body = post(broker, minted.token).json()
    expiration = datetime.fromisoformat(body["expiration"])
    assert expiration >= clock.now() + timedelta(seconds=890)  # STS's 900 s minimum
    until = minted.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    for statement in body["policy"]["Statement"]:
        assert statement["Condition"]["DateLessThan"] == {"aws:CurrentTime": until}


def test_bad_tokens_answer_401(broker: httpx.Client, clock: FakeClock) -> None:
    minted = mint(clock.now(), life=timedelta(minutes=5))
    header, claims, signature = minted.token.split(".")
    other_key = jwt.encode(
        {"sub": "x", "aud": "taskplat-capability", "iat": 1, "exp": 2**40},
        private_key_pem(b"\x49" * 32),
        algorithm="EdDSA",
        headers={"kid": "c1"},
    )
    unknown_kid = jwt.encode(
        {"sub": "x", "aud": "taskplat-capability", "iat": 1, "exp": 2**40},
        KEY_2,
        algorithm="EdDSA",
        headers={"kid": "c9"},
    )
    attempt_like = jwt.encode(
        {"sub": "x", "attempt": 1, "aud": "taskplat-attempt", "iat": 1, "exp": 2**40},
        KEY_1,
        algorithm="EdDSA",
        headers={"kid": "c1"},
    )
    for bad in (
        f"{header}.{claims}.{signature[:-2]}xx",
        other_key,
        unknown_kid,
        attempt_like,
        "garbage",
    ):
        response = post(broker, bad)
        assert response.status_code == 401, response.text
        assert response.json()["error"] == "invalid_token"
    assert broker.post("/credentials").status_code == 401
    clock.advance(5 * 60)
    expired = post(broker, minted.token)
    assert expired.status_code == 401 and "expired" in expired.json()["message"]


def test_bad_bodies_answer_4xx(broker: httpx.Client, clock: FakeClock) -> None:
    token = mint(clock.now()).token
    assert post(broker, token, content=b"{").status_code == 422
    assert post(broker, token, json={"unexpected": 1}).status_code == 422
    assert post(broker, token, content=b"x" * 5000).status_code == 413
    deep = post(broker, token, content=b"[" * 1000 + b"]" * 1000)  # within the size cap
    assert deep.status_code == 422 and "64 levels deep" in deep.json()["message"], deep.text
    assert post(broker, token, json={}).status_code == 200
    assert broker.get("/credentials").status_code == 405


def test_a_task_asking_too_often_gets_429(
    sqs_endpoint_url: str, role_arn: str, clock: FakeClock
) -> None:
    with serve(sqs_endpoint_url, role_arn, clock, rate_limit_per_task=2) as broker:
        minted = mint(clock.now())
        assert [post(broker, minted.token).status_code for _ in range(2)] == [200, 200]
        refused = post(broker, minted.token)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert post(broker, mint(clock.now()).token).status_code == 200  # another task


def test_key_rotation_accepts_two_keys_at_once(
    sqs_endpoint_url: str, role_arn: str, clock: FakeClock
) -> None:
    old, new = mint(clock.now(), kid="c1"), mint(clock.now(), kid="c2")
    with serve(
        sqs_endpoint_url, role_arn, clock, capability_token_keys=public(c1=KEY_1, c2=KEY_2)
    ) as rotating:
        assert post(rotating, old.token).status_code == 200
        assert post(rotating, new.token).status_code == 200
    with serve(
        sqs_endpoint_url, role_arn, clock, capability_token_keys=public(c2=KEY_2)
    ) as rotated:
        assert post(rotated, old.token).status_code == 401
        assert post(rotated, new.token).status_code == 200


def test_an_hs256_token_in_flight_works_during_the_rotation_window_only(
    sqs_endpoint_url: str, role_arn: str, clock: FakeClock
) -> None:
    """Moving off HS256: a capability token the dispatcher signed with its HS256 secret before
    the switch gets credentials while the broker lists that secret beside the new public key,
    and 401 once it is removed."""
    legacy = "legacy-hs256-capability-secret-0123456789"
    claims = jwt.decode(mint(clock.now()).token, options={"verify_signature": False})
    before_switch = jwt.encode(claims, legacy, algorithm="HS256", headers={"kid": "h1"})
    after_switch = mint(clock.now(), kid="c2").token
    window = json.dumps({"h1": legacy, **json.loads(public(c2=KEY_2))})
    with serve(sqs_endpoint_url, role_arn, clock, capability_token_keys=window) as during:
        assert post(during, before_switch).status_code == 200
        assert post(during, after_switch).status_code == 200
    with serve(sqs_endpoint_url, role_arn, clock, capability_token_keys=public(c2=KEY_2)) as after:
        assert post(after, before_switch).status_code == 401
        assert post(after, after_switch).status_code == 200


def test_the_broker_holds_public_keys_only(role_arn: str) -> None:
    """A private key in the broker's settings is refused at start: holding it, a broker could
    mint capability tokens."""
    with pytest.raises(ValidationError, match="'c1' is a private key"):
        broker_settings(
            role_arn, "http://localhost", capability_token_keys=json.dumps({"c1": KEY_1})
        )
    with pytest.raises(ValidationError, match="required"):
        broker_settings(role_arn, "http://localhost", capability_token_keys=None)
    held = broker_settings(role_arn, "http://localhost").token_keys()
    assert {held.kind(kid) for kid in held.keys} == {"public"} and held.active_kid is None


def test_health_and_metrics(broker: httpx.Client, clock: FakeClock) -> None:
    assert broker.get("/healthz").json() == {"status": "ok"}
    assert broker.get("/readyz").status_code == 200
    post(broker, mint(clock.now()).token)
    assert "taskplat_broker_requests" in broker.get("/metrics").text
