"""Attempt tokens: every claim returns one; it authorizes its own attempt's heartbeat, events and
completion, and nothing else (403); expired, tampered or unknown-key tokens answer 401; keys rotate
with two accepted at once. Untrusted claims also carry a capability token."""

from __future__ import annotations

import json
from base64 import urlsafe_b64decode
from typing import Any

import httpx
import jwt
import pytest

from taskplat.common.tokens.capability import (
    StorageLayout,
    capability_key_ring,
    verify_capability_token,
)
from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem
from taskplat.testkit.dispatcher_calls import (
    INTERNAL_ROUTES,
    PUBLIC_ROUTES,
    Lease,
    cancel,
    claim,
    create_task,
    cursor_event,
    replay,
)
from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher
from taskplat.testkit.dispatcher_rows import row_counts, task_state

KEY_1 = private_key_pem(b"\x11" * 32)
KEY_2 = private_key_pem(b"\x12" * 32)
CAP_KEY = private_key_pem(b"\x13" * 32)


def _claim(dispatcher: Dispatcher, task_id: str) -> tuple[Lease, dict[str, Any]]:
    response = claim(dispatcher, task_id)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == "Claimed", body
    return Lease(task_id, body["attempt"], body["lease_token"]), body


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _kid(token: str) -> str:
    header = token.split(".")[0]
    kid: str = json.loads(urlsafe_b64decode(header + "=" * (-len(header) % 4)))["kid"]
    return kid


def _own_calls(lease: Lease) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("/internal/heartbeat", lease.fence()),
        ("/internal/events", {**lease.fence(), "events": [cursor_event(1)]}),
        ("/internal/steps", {**lease.fence(), "step": "s", "result": 1}),
        ("/internal/task-complete", {**lease.fence(), "status": "Completed"}),
    ]


def test_an_attempt_token_serves_its_own_attempt(dispatcher: Dispatcher) -> None:
    lease, body = _claim(dispatcher, create_task(dispatcher)["task_id"])
    assert body["capability_token"] is None and body["task"]["trust"] == "trusted"
    with httpx.Client(base_url=dispatcher.base_url, headers=_as(body["attempt_token"])) as client:
        for path, request in _own_calls(lease):
            response = client.post(path, json=request)
            assert response.status_code == 200, (path, response.text)
    db_url = dispatcher.settings.database_url.get_secret_value()
    assert task_state(db_url, lease.task_id)["task"]["status"] == "Completed"


def test_an_attempt_token_is_refused_for_another_task_or_route(
    dispatcher: Dispatcher, db_url: str
) -> None:
    mine, body = _claim(dispatcher, create_task(dispatcher)["task_id"])
    other, _ = _claim(dispatcher, create_task(dispatcher)["task_id"])
    queued = create_task(dispatcher)["task_id"]
    counts, before = row_counts(db_url), task_state(db_url, other.task_id)
    with httpx.Client(base_url=dispatcher.base_url, headers=_as(body["attempt_token"])) as client:
        for path, request in _own_calls(other):  # another task's calls
            response = client.post(path, json=request)
            assert response.status_code == 403, (path, response.text)
            assert response.json()["error"] == "forbidden"
        wrong_attempt = {**mine.fence(), "attempt": mine.attempt + 1}
        assert client.post("/internal/heartbeat", json=wrong_attempt).status_code == 403
        for method, template in INTERNAL_ROUTES + PUBLIC_ROUTES:
            if template in {p for p, _ in _own_calls(mine)}:
                continue
            bodies: dict[str, Any] = {
                "/internal/task-claim": {"task_id": queued, "worker_id": "w"},
                "/internal/task-claim-batch": {"task_ids": [queued], "worker_id": "w"},
                "/internal/task-claim-next": {"queue": "default", "max": 1, "worker_id": "w"},
                "/internal/task-complete-batch": {
                    "completions": [{**mine.fence(), "status": "Completed"}]
                },
                "/tasks": {"operator": "echo"},
                "/tasks/batch": {"tasks": [{"operator": "echo"}]},
            }
            response = client.request(
                method,
                template.format(
                    task_id=mine.task_id,
                    dag_name="d",
                    job="a",
                    dataset_uuid=mine.task_id,
                    queue="default",
                    name="k",
                ),
                json=bodies.get(template) if method == "POST" else None,
                params={"task_id": mine.task_id} if template.endswith("fetch") else None,
            )
            assert response.status_code == 403, (method, template, response.text)
    assert row_counts(db_url) == counts
    assert task_state(db_url, other.task_id) == before
    assert task_state(db_url, queued)["task"]["status"] == "Queued"


def test_a_token_of_an_earlier_attempt_is_refused(dispatcher: Dispatcher) -> None:
    task_id = create_task(dispatcher)["task_id"]
    first, first_body = _claim(dispatcher, task_id)
    assert cancel(dispatcher, task_id).status_code == 200
    assert replay(dispatcher, task_id).status_code == 200
    second, second_body = _claim(dispatcher, task_id)
    assert second.attempt == first.attempt + 1
    old = httpx.Client(base_url=dispatcher.base_url, headers=_as(first_body["attempt_token"]))
    new = httpx.Client(base_url=dispatcher.base_url, headers=_as(second_body["attempt_token"]))
    with old, new:
        assert old.post("/internal/heartbeat", json=second.fence()).status_code == 403
        assert new.post("/internal/heartbeat", json=first.fence()).status_code == 403
        assert new.post("/internal/heartbeat", json=second.fence()).status_code == 200


def test_expired_tampered_and_unknown_key_tokens_answer_401(dispatcher: Dispatcher) -> None:
    lease, body = _claim(
        dispatcher,
        create_task(dispatcher)["task_id"],
    )
    token: str = body["attempt_token"]
    header, payload, signature = token.split(".")
    tampered_payload = json.loads(urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    tampered_payload["sub"] = str(tampered_payload["sub"])[:-1] + "0"
    forged = ".".join([header, json.dumps(tampered_payload).encode().hex(), signature])
    flipped = ".".join(
        [header, payload, signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")]
    )
    unknown = ".".join(
        [
            "eyJhbGciOiJIUzI1NiIsImtpZCI6Im5vcGUiLCJ0eXAiOiJKV1QifQ",  # kid "nope"
            payload,
            signature,
        ]
    )
    none_alg = ".".join(["eyJhbGciOiJub25lIiwia2lkIjoid29ya2VyLXRva2VuIn0", payload, ""])
    for bad in (forged, flipped, unknown, none_alg):
        response = httpx.post(
            f"{dispatcher.base_url}/internal/heartbeat", json=lease.fence(), headers=_as(bad)
        )
        assert response.status_code == 401, response.text
    # Valid until one lease after the deadline (default timeout 3600 s, lease 30 s).
    dispatcher.clock.advance(3600 + 30 - 5)
    with httpx.Client(base_url=dispatcher.base_url, headers=_as(token)) as client:
        assert client.post("/internal/heartbeat", json=lease.fence()).status_code != 401
        dispatcher.clock.advance(10)
        response = client.post("/internal/heartbeat", json=lease.fence())
        assert response.status_code == 401, response.text


def test_key_rotation_accepts_two_keys_at_once(db_url: str) -> None:
    def keys(**secrets: str) -> str:
        return json.dumps(secrets)

    with serve_dispatcher(
        db_url, attempt_token_keys=keys(k1=KEY_1), attempt_token_active_kid="k1"
    ) as old:
        lease, body = _claim(old, create_task(old)["task_id"])
        token_1 = body["attempt_token"]
        assert _kid(token_1) == "k1"
    with serve_dispatcher(
        db_url, attempt_token_keys=keys(k1=KEY_1, k2=KEY_2), attempt_token_active_kid="k2"
    ) as rotating:
        response = httpx.post(
            f"{rotating.base_url}/internal/heartbeat", json=lease.fence(), headers=_as(token_1)
        )
        assert response.status_code == 200, response.text
        lease_2, body_2 = _claim(rotating, create_task(rotating)["task_id"])
        token_2 = body_2["attempt_token"]
        assert _kid(token_2) == "k2"
    with serve_dispatcher(
        db_url, attempt_token_keys=keys(k2=KEY_2), attempt_token_active_kid="k2"
    ) as rotated:
        for token, fence, expected in ((token_1, lease, 401), (token_2, lease_2, 200)):
            response = httpx.post(
                f"{rotated.base_url}/internal/heartbeat", json=fence.fence(), headers=_as(token)
            )
            assert response.status_code == expected, response.text


def test_an_hs256_token_in_flight_is_accepted_during_the_rotation_window_only(
    db_url: str,
) -> None:
    """Moving off HS256: a token signed with the old HS256 secret before the switch (as the
    platform signed them, PyJWT's HS256 with the same claims) still works while the secret is
    listed beside the new Ed25519 key, and answers 401 once the window ends."""
    legacy = "legacy-hs256-attempt-secret-0123456789"
    during = json.dumps({"h1": legacy, "k2": KEY_2})
    with serve_dispatcher(db_url, attempt_token_keys=during, attempt_token_active_kid="k2") as d:
        lease, body = _claim(d, create_task(d)["task_id"])
        assert _kid(body["attempt_token"]) == "k2"
        now = int(d.clock.now().timestamp())
        claims = {"sub": lease.task_id, "attempt": lease.attempt, "aud": "taskplat-attempt",
                  "iat": now - 60, "exp": now + 600}  # fmt: skip
        before_switch = jwt.encode(claims, legacy, algorithm="HS256", headers={"kid": "h1"})
        response = httpx.post(
            f"{d.base_url}/internal/heartbeat", json=lease.fence(), headers=_as(before_switch)
        )
        assert response.status_code == 200, response.text
    after = json.dumps({"k2": KEY_2})
    with serve_dispatcher(db_url, attempt_token_keys=after, attempt_token_active_kid="k2") as d:
        response = httpx.post(
            f"{d.base_url}/internal/heartbeat", json=lease.fence(), headers=_as(before_switch)
        )
        assert response.status_code == 401, response.text
        response = httpx.post(
            f"{d.base_url}/internal/heartbeat",
            json=lease.fence(),
            headers=_as(body["attempt_token"]),
        )
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "keys",
    [
        {"attempt_token_keys": '{"k1": "short"}', "attempt_token_active_kid": "k1"},
        {"attempt_token_keys": json.dumps({"k1": KEY_1}), "attempt_token_active_kid": "k9"},
        {"attempt_token_keys": json.dumps({"k1": KEY_1})},
        # An HS256 secret verifies during a rotation window but never signs.
        {"attempt_token_keys": json.dumps({"h1": "h" * 32}), "attempt_token_active_kid": "h1"},
    ],
)
def test_bad_key_settings_are_refused(db_url: str, keys: dict[str, str]) -> None:
    from pydantic import ValidationError

    from taskplat.testkit.dispatcher_harness import make_settings

    with pytest.raises(ValidationError):
        make_settings(db_url, **keys)


def test_an_untrusted_claim_carries_a_capability_token(db_url: str) -> None:
    dataset, version = (
        "6f1c1d44-3f0a-4a8c-9a53-0c7f35b8e2a1",
        "0d7a53a9-7a7e-4c1b-8f43-8f9e8c1f2b10",
    )
    with serve_dispatcher(
        db_url,
        untrusted_operators="udf",
        capability_token_keys=json.dumps({"c1": CAP_KEY}),
        capability_token_active_kid="c1",
        data_bucket="lake",
    ) as dispatcher:
        inputs = [{"dataset_uuid": dataset, "dataset_version": version, "cursor": 7}]
        task_id = create_task(dispatcher, operator="udf", inputs=inputs)["task_id"]
        lease, body = _claim(dispatcher, task_id)
        assert body["task"]["trust"] == "untrusted"
        ring = capability_key_ring(
            TokenKeySettings.model_validate({"keys": {"c1": CAP_KEY}, "active_kid": "c1"})
        )
        verified = verify_capability_token(
            ring, body["capability_token"], now=dispatcher.clock.now()
        )
        layout = StorageLayout("lake")
        assert verified.capability.read_prefixes() == [
            f"s3://lake/dataset/{dataset}/version/{version}/"
        ]
        assert verified.capability.write_prefixes() == [
            layout.scratch_prefix(verified.capability.task_id, lease.attempt)
        ]
        fetched = dispatcher.worker.get("/internal/task-fetch", params={"task_id": task_id})
        assert fetched.json()["task"]["trust"] == "untrusted"
        _, trusted_body = _claim(dispatcher, create_task(dispatcher)["task_id"])
        assert trusted_body["capability_token"] is None


def test_an_untrusted_job_grants_its_pinned_inputs_and_its_outputs(db_url: str) -> None:
    with serve_dispatcher(
        db_url,
        capability_token_keys=json.dumps({"c1": CAP_KEY}),
        capability_token_active_kid="c1",
        data_bucket="lake",
    ) as dispatcher:
        doc = {
            "jobs": {
                "udf": {
                    "operator": "udf",
                    "trust": "untrusted",
                    "inputs": [{"from": {"dataset": "raw"}, "where": "x > 1"}],
                    "outputs": [{"index": 0, "dataset": "curated", "kind": "s3"}],
                }
            }
        }
        assert dispatcher.api.put("/dags/lake", json=doc).status_code == 201
        datasets = {d["name"]: d for d in dispatcher.api.get("/datasets").json()["datasets"]}
        raw, curated = datasets["raw"], datasets["curated"]
        pin = {"dataset_uuid": raw["dataset_uuid"], "dataset_version": raw["current_version"],
               "cursor": 9, "where": "x > 1"}  # fmt: skip
        run = dispatcher.api.post("/dags/lake/jobs/udf/runs", json={"inputs": [pin]}).json()
        lease, body = _claim(dispatcher, run["task_id"])
        assert body["task"]["trust"] == "untrusted"
        ring = capability_key_ring(
            TokenKeySettings.model_validate({"keys": {"c1": CAP_KEY}, "active_kid": "c1"})
        )
        capability = verify_capability_token(
            ring, body["capability_token"], now=dispatcher.clock.now()
        ).capability
        assert [(str(i.dataset_uuid), i.cursor, i.where) for i in capability.inputs] == [
            (raw["dataset_uuid"], 9, "x > 1")
        ]
        assert capability.read_prefixes() == [
            f"s3://lake/dataset/{raw['dataset_uuid']}/version/{raw['current_version']}/"
        ]
        out = f"s3://lake/dataset/{curated['dataset_uuid']}/version/{curated['current_version']}/"
        assert out in capability.write_prefixes()
        assert lease.attempt == capability.attempt == 1
