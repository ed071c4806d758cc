"""A dispatcher (for applying DAGs), sink settings with a queue prefix unique to the test, and
helpers to publish to a buffer, read a DLQ and read a dataset table, for the sink's tests.

Invariants: every test has its own database and its own SQS queue names; publishing uses a plain
SQS client, as any producer may.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from taskplat.common.db.queries import parse_queries
from taskplat.sink.settings import SinkSettings

if TYPE_CHECKING:
    from types_boto3_sqs.client import SQSClient

_SQL_PATH = Path(__file__).with_name("sink_rows.sql")
Q = parse_queries(_SQL_PATH.read_text(encoding="utf-8"), source=str(_SQL_PATH))

ORG = "00000000-0000-4000-8000-00000000000a"
SCHEMA = [{"name": "severity", "type": "text"}, {"name": "score", "type": "bigint"},
          {"name": "payload", "type": "jsonb"}]  # fmt: skip


def make_settings(db_url: str, sqs_endpoint_url: str, **overrides: object) -> SinkSettings:
    values: dict[str, object] = {
        "database_url": db_url,
        "sqs_endpoint_url": sqs_endpoint_url,
        "sqs_queue_prefix": f"t{secrets.token_hex(4)}-",
        "db_pool_min_size": 1,
        "db_pool_max_size": 8,
        "wait_time_seconds": 1,
        "discovery_interval_seconds": 0.2,
        "visibility_timeout_seconds": 30,
    }
    values.update(overrides)
    return SinkSettings(**values)  # type: ignore[arg-type]


def buffered_dag(schema: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "jobs": {
            "produce": {
                "operator": "echo",
                "outputs": [{"index": 0, "dataset": "alerts", "kind": "buffered_postgres",
                             "schema": SCHEMA if schema is None else schema}],
            },
            "consume": {"operator": "echo", "inputs": [{"from": {"dataset": "alerts"}}]},
        }
    }  # fmt: skip


def record(key: str, **fields: Any) -> dict[str, Any]:
    return {"org_id": ORG, "dedupe_key": key, "severity": "warning", **fields}


def body(dataset: dict[str, Any], records: list[Any], **overrides: Any) -> str:
    message = {
        "dataset_uuid": dataset["dataset_uuid"],
        "schema_hash": dataset["schema_hash"],
        "records": records,
        **overrides,
    }
    return json.dumps(message)


def publish(sqs: SQSClient, queue_url: str, bodies: list[str]) -> None:
    for start in range(0, len(bodies), 10):
        chunk = bodies[start : start + 10]
        answer = sqs.send_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk)],
        )
        assert not answer.get("Failed"), answer


def dead_letters(sqs: SQSClient, dlq_url: str, expected: int) -> list[tuple[str, str]]:
    """(reason, body) of the DLQ's messages, once `expected` of them arrived."""
    found: list[tuple[str, str]] = []
    for _ in range(20):
        answer = sqs.receive_message(
            QueueUrl=dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
        )  # fmt: skip
        for message in answer.get("Messages", []):
            reason = message["MessageAttributes"]["reason"]["StringValue"]
            found.append((reason, message["Body"]))
            sqs.delete_message(QueueUrl=dlq_url, ReceiptHandle=message["ReceiptHandle"])
        if len(found) >= expected:
            break
    return found


def table_rows(db_url: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        statement = sql.SQL("SELECT * FROM {} ORDER BY row_id").format(sql.Identifier(table))
        return conn.execute(statement).fetchall()


def dataset_events(db_url: str, dataset_uuid: str | UUID) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        return conn.execute(Q["dataset_events"], {"dataset_uuid": dataset_uuid}).fetchall()
