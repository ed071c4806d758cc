"""The data services of a local stack: the credential broker and the query service, with what they
need (capability keys, the data bucket, the query service's read-only database user).

Invariants:
- The capability-token key (Ed25519) is derived from the run directory's worker token, like the
  attempt key: the dispatcher and the relay sign with it; the two services get its public half
  only, and no attempt-token key; worker wrappers get none of them.
- The query service connects as `taskplat_query_dev`, a login user that is only a member of
  `taskplat_query` (migration 0019); it gets neither `DATABASE_URL` nor the API keys. The broker
  gets no database URL at all.
- Both services talk to the stack's LocalStack (STS and S3) with LocalStack's dummy credentials
  and a role ARN LocalStack accepts; the data bucket exists before they start.
- Worker wrappers get `TASKPLAT_QUERY_URL` and `TASKPLAT_CREDENTIALS_URL`, which they pass to
  every operator.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from taskplat.devstack.errors import DevstackError

DATA_SERVICES: dict[str, str] = {
    "credential-broker": "taskplat.credential_broker",
    "query-service": "taskplat.query_service",
}
CAPABILITY_KID = "devstack-capability"
DATA_BUCKET = "taskplat-data"
ROLE_ARN = "arn:aws:iam::000000000000:role/taskplat-data-access"
QUERY_USER = "taskplat_query_dev"
# What only the services that sign or verify capability tokens get.
CAPABILITY_SETTINGS = ("TASKPLAT_CAPABILITY_TOKEN_KEYS", "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID")
# The data services verify capability tokens with public keys and hold no private key.
_NOT_FOR_DATA_SERVICES = (
    "DATABASE_URL",
    "TASKPLAT_API_KEYS",
    "TASKPLAT_WORKER_TOKEN",
    "TASKPLAT_ATTEMPT_TOKEN_KEYS",
    "TASKPLAT_ATTEMPT_TOKEN_ACTIVE_KID",
    "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID",
)
_LOCALSTACK_KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


def _derived(worker_token: str, purpose: str) -> str:
    return hashlib.sha256(f"taskplat-{purpose}:{worker_token}".encode()).hexdigest()


def capability_env(worker_token: str) -> dict[str, str]:
    """The capability-token settings of the signers (the dispatcher, the relay): an Ed25519
    private key derived from the worker token. The data services get its public half only
    (`service_envs`)."""
    from taskplat.common.tokens.keys import private_key_pem

    seed = bytes.fromhex(_derived(worker_token, "capability-token"))
    return {
        "TASKPLAT_CAPABILITY_TOKEN_KEYS": json.dumps({CAPABILITY_KID: private_key_pem(seed)}),
        "TASKPLAT_CAPABILITY_TOKEN_ACTIVE_KID": CAPABILITY_KID,
        "TASKPLAT_DATA_BUCKET": DATA_BUCKET,
    }


def verifier_keys(signer_keys: str) -> str:
    """The public halves of the signers' `TASKPLAT_CAPABILITY_TOKEN_KEYS` (JSON), for the
    services that only verify."""
    from pydantic import SecretStr

    from taskplat.common.tokens.keys import TokenKeySettings

    keys = {kid: SecretStr(key) for kid, key in json.loads(signer_keys).items()}
    public = TokenKeySettings(keys=keys).public().keys
    return json.dumps({kid: key.get_secret_value() for kid, key in public.items()})


def create_query_user(database_url: str, worker_token: str) -> str:
    """Create (or re-password) the query service's login user; its libpq URL."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    password = _derived(worker_token, "query-user")[:32]
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", (QUERY_USER,)
            ).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(
                sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(QUERY_USER), sql.Literal(password)
                )
            )
            conn.execute(sql.SQL("GRANT taskplat_query TO {}").format(sql.Identifier(QUERY_USER)))
    except psycopg.Error as exc:
        raise DevstackError(f"cannot create the query service's database user: {exc}") from exc
    return make_conninfo(database_url, user=QUERY_USER, password=password)


def create_bucket(endpoint_url: str, region: str, bucket: str = DATA_BUCKET) -> None:
    """`bucket` on the local S3 endpoint, unless it exists."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    s3: Any = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    try:
        names = [b["Name"] for b in s3.list_buckets().get("Buckets", [])]
        if bucket not in names:
            s3.create_bucket(Bucket=bucket)
    except (BotoCoreError, ClientError) as exc:
        raise DevstackError(f"cannot create the S3 bucket {bucket}: {exc}") from exc
    finally:
        s3.close()


def service_envs(
    shared: Mapping[str, str],
    *,
    endpoint_url: str,
    broker_port: int,
    query_port: int,
    query_database_url: str,
) -> dict[str, dict[str, str]]:
    """The full environment of each data service (the shared one without the database URL, the
    API keys, the worker token and every private key, with the capability keys' public halves,
    plus its own settings)."""
    base = {k: v for k, v in shared.items() if k not in _NOT_FOR_DATA_SERVICES}
    if "TASKPLAT_CAPABILITY_TOKEN_KEYS" in base:
        base["TASKPLAT_CAPABILITY_TOKEN_KEYS"] = verifier_keys(
            base["TASKPLAT_CAPABILITY_TOKEN_KEYS"]
        )
    base.update(_LOCALSTACK_KEYS)
    return {
        "credential-broker": {
            **base,
            "TASKPLAT_BROKER_HOST": "127.0.0.1",
            "TASKPLAT_BROKER_PORT": str(broker_port),
            "TASKPLAT_BROKER_ROLE_ARN": ROLE_ARN,
            "TASKPLAT_BROKER_STS_ENDPOINT_URL": endpoint_url,
        },
        "query-service": {
            **base,
            "TASKPLAT_QUERY_HOST": "127.0.0.1",
            "TASKPLAT_QUERY_PORT": str(query_port),
            "TASKPLAT_QUERY_DATABASE_URL": query_database_url,
            "TASKPLAT_QUERY_ROLE_ARN": ROLE_ARN,
            "TASKPLAT_QUERY_STS_ENDPOINT_URL": endpoint_url,
            "TASKPLAT_QUERY_S3_ENDPOINT_URL": endpoint_url,
        },
    }
