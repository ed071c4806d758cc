"""A query service for tests: the real app on a real uvicorn in a thread, reading a private
migrated Postgres through a login user that is only a member of `taskplat_query`, and LocalStack's
STS and S3; helpers that create datasets through the platform's own functions (the ones the
dispatcher's DAG apply calls, never rows written here) and mint capability tokens as the
dispatcher issues them, each for an attempt that is running (`taskplat.devstack.attempts`): the
database answers a token's reads only while its attempt runs (`taskplat_query_inputs`, 0029).

Invariant: every AWS client here uses LocalStack's endpoint and its dummy credentials, never a
developer's ~/.aws.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import boto3
import duckdb
import httpx
import psycopg
import uvicorn
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from pydantic import SecretStr

from taskplat.common.buffered import full_schema, schema_hash
from taskplat.common.clock import Clock
from taskplat.common.telemetry import Telemetry
from taskplat.common.tokens.capability import (
    StorageLayout,
    build_capability,
    capability_key_ring,
    issue_capability_token,
)
from taskplat.common.tokens.keys import TokenKeySettings, private_key_pem
from taskplat.devstack.attempts import running_attempt
from taskplat.devstack.ports import free_port
from taskplat.devstack.waiting import wait_for
from taskplat.query_service.app import create_app
from taskplat.query_service.settings import QuerySettings

# The dispatcher signs with the private key; the service holds its public half only.
KEY = private_key_pem(b"\x71" * 32)


def public_key(private: str) -> str:
    settings = TokenKeySettings(keys={"k": SecretStr(private)})
    return settings.public().keys["k"].get_secret_value()


BUCKET = "lake"
REGION = "us-east-1"
ROLE_ARN = "arn:aws:iam::000000000000:role/taskplat-query-data"
ORG = UUID("00000000-0000-0000-0000-0000000000a1")


def aws(service: str, endpoint: str) -> Any:
    return boto3.session.Session().client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


@contextmanager
def query_user(db_url: str) -> Iterator[str]:
    """A login user of `db_url`'s cluster that is only a member of `taskplat_query`."""
    user = f"query_test_{secrets.token_hex(4)}"
    password = secrets.token_hex(8)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE taskplat_query").format(
                sql.Identifier(user), sql.Literal(password)
            )
        )
    try:
        yield make_conninfo(db_url, user=user, password=password)
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(user)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))


@dataclass(frozen=True)
class Dataset:
    dataset_uuid: UUID
    dataset_version: UUID
    name: str
    kind: str
    table: str | None = None
    database: str = field(default="", repr=False)  # the URL of the database it is in

    def pin(self) -> dict[str, Any]:
        return {
            "dataset_uuid": str(self.dataset_uuid),
            "dataset_version": str(self.dataset_version),
            "cursor": 1,
        }

    @property
    def prefix_key(self) -> str:
        return f"dataset/{self.dataset_uuid}/version/{self.dataset_version}/"


def _catalog(conn: psycopg.Connection[Any], name: str, kind: str, location: str) -> Dataset:
    """A dataset with its first version, created by the platform's function (the dispatcher's
    DAG apply calls it too: taskplat_create_dataset, migration 0022)."""
    row = conn.execute(
        "SELECT dataset_uuid, current_version FROM taskplat_create_dataset(%s, %s, %s)",
        (name, kind, location),
    ).fetchone()
    assert row is not None, f"dataset {name!r} exists already"
    return Dataset(row[0], row[1], name, kind)


def buffered_dataset(
    db_url: str, name: str, columns: list[dict[str, str]], rows: Sequence[dict[str, Any]]
) -> Dataset:
    """A buffered dataset as the dispatcher creates it (the dataset, its version and its table
    through the platform's functions: taskplat_add_dataset_table, migration 0022) holding `rows`
    as the sink writes them."""
    full = full_schema([(c["name"], c["type"]) for c in columns])
    with psycopg.connect(db_url, autocommit=True) as conn:
        made = _catalog(conn, name, "buffered_postgres", "postgres_table:dataset_{dataset_uuid}")
        spec = [{"name": c.name, "type": c.type} for c in full]
        created = conn.execute(
            "SELECT taskplat_add_dataset_table(%s, %s, %s, %s)",
            (made.dataset_uuid, made.dataset_version, Jsonb(spec), schema_hash(full)),
        ).fetchone()
        assert created is not None
        table: str = created[0]
        for index, row in enumerate(rows):
            values = {"org_id": ORG, "dedupe_key": f"k{index}", **row}
            conn.execute(
                sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    sql.Identifier(table),
                    sql.SQL(", ").join(map(sql.Identifier, values)),
                    sql.SQL(", ").join(sql.Placeholder() * len(values)),
                ),
                list(values.values()),
            )
    return replace(made, table=table, database=db_url)


def s3_dataset(db_url: str, endpoint: str, name: str, select: str) -> Dataset:
    """An S3 dataset whose pinned version holds the rows of `select` as one Parquet object."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        made = _catalog(
            conn, name, "s3", f"s3://{BUCKET}/dataset/{{dataset_uuid}}/version/{{dataset_version}}/"
        )
    put_parquet(endpoint, made.prefix_key + "part-0.parquet", select)
    return replace(made, database=db_url)


def put_parquet(endpoint: str, key: str, select: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "part.parquet"
        duckdb.connect().execute(f"COPY ({select}) TO '{path}' (FORMAT parquet)")
        aws("s3", endpoint).put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())


def mint(
    datasets: Sequence[Dataset],
    *,
    now: datetime | None = None,
    life: timedelta = timedelta(hours=1),
    task_id: UUID | None = None,
    key: str = KEY,
) -> str:
    """A capability token pinning `datasets`, as the dispatcher issues it at claim time: for a
    new running attempt pinning them, unless `task_id` names the task (attempt 1)."""
    if task_id is None:
        databases = {d.database for d in datasets}
        assert len(databases) <= 1, "the datasets of one token are of one database"
        pins = [d.pin() for d in datasets]
        task_id = running_attempt(databases.pop(), pins) if databases else uuid.uuid4()
    ring = capability_key_ring(TokenKeySettings(keys={"q1": SecretStr(key)}, active_kid="q1"))
    capability = build_capability(
        task_id,
        1,
        [d.pin() for d in datasets],
        [],
        layout=StorageLayout(BUCKET),
    )
    issued = now or datetime.now(UTC)
    return issue_capability_token(ring, capability, now=issued, expires_at=issued + life)


def settings(database_url: str, endpoint: str, **overrides: Any) -> QuerySettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "role_arn": ROLE_ARN,
        "sts_endpoint_url": endpoint,
        "s3_endpoint_url": endpoint,
        "capability_token_keys": json.dumps({"q1": public_key(KEY)}),
        "data_bucket": BUCKET,
    }
    values.update(overrides)
    return QuerySettings(**values)


@contextmanager
def served(
    config: QuerySettings, clock: Clock | None = None, telemetry: Telemetry | None = None
) -> Iterator[httpx.Client]:
    """The query service app on a real uvicorn server in a thread; a client of it."""
    port = free_port()
    app = create_app(
        config, sts=aws("sts", config.sts_endpoint_url or ""), clock=clock, telemetry=telemetry
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, name="query-service", daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=15, what="the query service to start")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def ask(client: httpx.Client, token: str, query: str, **body: Any) -> httpx.Response:
    return client.post(
        "/query", headers={"Authorization": f"Bearer {token}"}, json={"sql": query, **body}
    )
