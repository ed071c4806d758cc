"""A credential broker for tests: an in-process app on LocalStack's STS, with helpers to mint
capability tokens as the dispatcher would.

Invariant: every AWS client here uses LocalStack's endpoint and its dummy credentials, never a
developer's ~/.aws.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import boto3
import httpx
import uvicorn
from pydantic import SecretStr

from taskplat.common.clock import Clock
from taskplat.common.telemetry import Telemetry
from taskplat.common.tokens.capability import (
    Capability,
    StorageLayout,
    build_capability,
    capability_key_ring,
    issue_capability_token,
)
from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem
from taskplat.credential_broker.app import create_app
from taskplat.credential_broker.settings import BrokerSettings
from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for

# The dispatcher signs with the private keys; the broker holds their public halves only.
KEY_1 = private_key_pem(b"\x41" * 32)
KEY_2 = private_key_pem(b"\x42" * 32)


def public(**keys: str) -> str:
    """The verifier's JSON setting of the public halves of `keys` (kid: private PEM)."""
    settings = TokenKeySettings(keys={k: SecretStr(v) for k, v in keys.items()}).public()
    return json.dumps({k: v.get_secret_value() for k, v in settings.keys.items()})


BUCKET = "lake"
REGION = "us-east-1"


def aws(service: str, endpoint: str, **credentials: str) -> Any:
    keys = credentials or {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
    return boto3.session.Session().client(
        service, endpoint_url=endpoint, region_name=REGION, **keys
    )


def make_role(endpoint: str) -> str:
    iam = aws("iam", endpoint)
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
    name = f"taskplat-operator-data-{uuid.uuid4().hex[:8]}"
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
    arn: str = role["Role"]["Arn"]
    return arn


def broker_settings(role_arn: str, endpoint: str, **overrides: Any) -> BrokerSettings:
    values: dict[str, Any] = {
        "role_arn": role_arn,
        "sts_endpoint_url": endpoint,
        "capability_token_keys": public(c1=KEY_1),
        "data_bucket": BUCKET,
    }
    values.update(overrides)
    return BrokerSettings(**values)


@dataclass(frozen=True)
class Minted:
    token: str
    capability: Capability
    expires_at: datetime


def mint(
    now: datetime,
    *,
    life: timedelta = timedelta(hours=1),
    kid: str = "c1",
    inputs: list[dict[str, Any]] | None = None,
    outputs: list[dict[str, Any]] | None = None,
    task_id: UUID | None = None,
) -> Minted:
    """A capability token as the dispatcher issues it at claim time."""
    ring = capability_key_ring(
        TokenKeySettings(keys={"c1": SecretStr(KEY_1), "c2": SecretStr(KEY_2)}, active_kid=kid)
    )
    capability = build_capability(
        task_id or uuid.uuid4(), 1, inputs or [], outputs or [], layout=StorageLayout(BUCKET)
    )
    expires_at = now + life
    token = issue_capability_token(ring, capability, now=now, expires_at=expires_at)
    return Minted(token, capability, expires_at)


@contextmanager
def served(
    settings: BrokerSettings, sts: Any, clock: Clock, telemetry: Telemetry | None = None
) -> Iterator[httpx.Client]:
    """The broker app on a real uvicorn server in a thread; a client of it."""
    port = free_port()
    app = create_app(settings, sts=sts, clock=clock, telemetry=telemetry)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=15, what="the broker to start")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=15)
